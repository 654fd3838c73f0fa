"""Traced point-to-point messages: the only communication the from-scratch collectives use.

Thin wrappers over torch.distributed's send / recv / isend / irecv / batch_isend_irecv
that record a "send" or "recv" event (peer, bytes, start, end) in a `ddnb.trace.Tracer`.
Peers are ranks *within* `group` (as in the algorithms' papers), converted here to the
global ranks torch.distributed expects. In an emulated cluster (`ddnb.emulate`) every
message goes through `ddnb.emulate.messages` instead, and the events record emulated
seconds. Taught in `notebooks/03_collectives.ipynb`.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from ddnb.emulate.clock import current as _emulator
from ddnb.trace import Tracer, get_tracer


def group_rank(group=None) -> int:
    return dist.get_rank(group)


def group_size(group=None) -> int:
    return dist.get_world_size(group)


def global_rank(peer: int, group=None) -> int:
    """The global rank of rank `peer` of `group` (None: the world, where they are equal)."""
    return peer if group is None or group is dist.group.WORLD else dist.get_global_rank(group, peer)


_global = global_rank


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def send(tensor: torch.Tensor, dst: int, group=None, tracer: Tracer | None = None, name: str = "send") -> None:
    isend(tensor, dst, group, tracer, name).wait()


def recv(tensor: torch.Tensor, src: int, group=None, tracer: Tracer | None = None, name: str = "recv") -> None:
    irecv(tensor, src, group, tracer, name).wait()


class Pending:
    """A posted isend/irecv; `wait()` completes it and records its event (from posting
    to completion)."""

    def __init__(self, work, kind, name, peer, size, tracer):
        self.work, self.kind, self.name, self.peer, self.size = work, kind, name, peer, size
        self.tracer, self.start, self.done = tracer, time.time(), False

    def wait(self) -> None:
        if not self.done:
            times = self.work.wait()   # emulated work returns its (start, end)
            start, end = times if isinstance(times, tuple) else (self.start, time.time())
            self.done = True
            get_tracer(self.tracer).record(self.kind, self.name, start, end, peer=self.peer, nbytes=self.size)


def isend(tensor, dst, group=None, tracer=None, name="send") -> Pending:
    if _emulator():
        from ddnb.emulate import messages

        work = messages.isend(tensor, _global(dst, group), group=group)
    else:
        work = dist.isend(tensor, _global(dst, group), group=group)
    return Pending(work, "send", name, dst, nbytes(tensor), tracer)


def irecv(tensor, src, group=None, tracer=None, name="recv") -> Pending:
    if _emulator():
        from ddnb.emulate import messages

        work = messages.irecv(tensor, _global(src, group), group=group)
    else:
        work = dist.irecv(tensor, _global(src, group), group=group)
    return Pending(work, "recv", name, src, nbytes(tensor), tracer)


def exchange(send_tensor: torch.Tensor | None, dst: int | None, recv_tensor: torch.Tensor | None,
             src: int | None, group=None, tracer: Tracer | None = None, name: str = "") -> None:
    """Send to `dst` and receive from `src` at the same time (either may be None), with
    batch_isend_irecv so that neither side waits for the other to post first: the
    deadlock-free step every ring and butterfly algorithm is made of."""
    sending, receiving = send_tensor is not None and dst is not None, recv_tensor is not None and src is not None
    if _emulator() and (sending or receiving):
        from ddnb.emulate import messages

        times = iter(messages.exchange(send_tensor if sending else None, _global(dst, group) if sending else None,
                                       recv_tensor if receiving else None, _global(src, group) if receiving else None,
                                       group=group))
        tr = get_tracer(tracer)
        if sending:
            tr.record("send", name or "send", *next(times), peer=dst, nbytes=nbytes(send_tensor))
        if receiving:
            tr.record("recv", name or "recv", *next(times), peer=src, nbytes=nbytes(recv_tensor))
        return
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
