"""Traced point-to-point messages: the only communication the from-scratch collectives use.

Thin wrappers over torch.distributed's send / recv / isend / irecv / batch_isend_irecv
that record a "send" or "recv" event (peer, bytes, start, end) in a `ddnb.trace.Tracer`.
Peers are ranks *within* `group` (as in the algorithms' papers), converted here to the
global ranks torch.distributed expects. Taught in `notebooks/03_collectives.ipynb`.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from ddnb.trace import Tracer, get_tracer


def group_rank(group=None) -> int:
    return dist.get_rank(group)


def group_size(group=None) -> int:
    return dist.get_world_size(group)


def _global(peer: int, group) -> int:
    return peer if group is None or group is dist.group.WORLD else dist.get_global_rank(group, peer)


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def send(tensor: torch.Tensor, dst: int, group=None, tracer: Tracer | None = None, name: str = "send") -> None:
    start = time.time()
    dist.send(tensor, _global(dst, group), group=group)
    get_tracer(tracer).record("send", name, start, time.time(), peer=dst, nbytes=nbytes(tensor))


def recv(tensor: torch.Tensor, src: int, group=None, tracer: Tracer | None = None, name: str = "recv") -> None:
    start = time.time()
    dist.recv(tensor, _global(src, group), group=group)
    get_tracer(tracer).record("recv", name, start, time.time(), peer=src, nbytes=nbytes(tensor))


class Pending:
    """A posted isend/irecv; `wait()` completes it and records its event (from posting
    to completion)."""

    def __init__(self, work, kind, name, peer, size, tracer):
        self.work, self.kind, self.name, self.peer, self.size = work, kind, name, peer, size
        self.tracer, self.start, self.done = tracer, time.time(), False

    def wait(self) -> None:
        if not self.done:
            self.work.wait()
            self.done = True
            get_tracer(self.tracer).record(self.kind, self.name, self.start, time.time(),
                                           peer=self.peer, nbytes=self.size)


def isend(tensor, dst, group=None, tracer=None, name="send") -> Pending:
    return Pending(dist.isend(tensor, _global(dst, group), group=group), "send", name, dst, nbytes(tensor), tracer)


def irecv(tensor, src, group=None, tracer=None, name="recv") -> Pending:
    return Pending(dist.irecv(tensor, _global(src, group), group=group), "recv", name, src, nbytes(tensor), tracer)


def exchange(send_tensor: torch.Tensor | None, dst: int | None, recv_tensor: torch.Tensor | None,
             src: int | None, group=None, tracer: Tracer | None = None, name: str = "") -> None:
    """Send to `dst` and receive from `src` at the same time (either may be None), with
    batch_isend_irecv so that neither side waits for the other to post first: the
    deadlock-free step every ring and butterfly algorithm is made of."""
    ops, kinds = [], []
    if send_tensor is not None and dst is not None:
        ops.append(dist.P2POp(dist.isend, send_tensor, _global(dst, group), group=group))
        kinds.append(("send", dst, nbytes(send_tensor)))
    if recv_tensor is not None and src is not None:
        ops.append(dist.P2POp(dist.irecv, recv_tensor, _global(src, group), group=group))
        kinds.append(("recv", src, nbytes(recv_tensor)))
    if not ops:
        return
    start = time.time()
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    end = time.time()
    tr = get_tracer(tracer)
    for kind, peer, size in kinds:
        tr.record(kind, name or kind, start, end, peer=peer, nbytes=size)
