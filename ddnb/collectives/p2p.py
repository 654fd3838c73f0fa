"""Traced point-to-point messages: the only communication the from-scratch collectives
and the pipeline stages use.

Thin wrappers over torch.distributed's send / recv / isend / irecv / batch_isend_irecv
that record a "send" or "recv" event (peer, bytes, start, end) in a `ddnb.trace.Tracer`.
Peers are ranks *within* `group` (as in the algorithms' papers), converted to the
global ranks torch.distributed expects by `global_rank`, the one place that does it.

    send / recv            blocking; the event spans the call
    isend / irecv          posted now; `Pending.wait()` completes it and records its event
    post([Op, ...])        several sends and receives posted together in one
                           batch_isend_irecv, one `Pending` each (tags, trace names and
                           fields per message: what a pipeline stage needs)
    exchange               a send and a receive posted together and both waited for: the
                           deadlock-free step of the ring and butterfly algorithms

A CUDA tensor on a gloo group travels through a host copy (gloo's point-to-point messages
read host memory only: `ddnb.collectives.devices.wire_device`): a send copies it to the
host first, a receive lands in a host buffer that completing it copies back, so every
caller may pass tensors on their own device.

In an emulated cluster every message goes through the transport the emulator plugged in
when the worker started (`set_transport`: `ddnb.emulate.messages.post`, the same bytes
plus a header with its send time), and the events record emulated seconds; this module
imports nothing of the emulator. Taught in `notebooks/03_collectives.ipynb`.
"""
from __future__ import annotations

import time
from datetime import timedelta
from typing import NamedTuple

import torch
import torch.distributed as dist

from ddnb.collectives.devices import wire_device
from ddnb.trace import Tracer, get_tracer


def group_rank(group=None) -> int:
    return dist.get_rank(group)


def group_size(group=None) -> int:
    return dist.get_world_size(group)


def global_rank(group, rank: int) -> int:
    """The global rank (in the default group) of rank `rank` of `group`: what
    torch.distributed's p2p calls and a collective's src / dst take. With group None or
    WORLD the two numberings are the same."""
    return rank if group is None or group is dist.group.WORLD else dist.get_global_rank(group, rank)


def group_ranks(group=None) -> list[int]:
    """The global ranks of `group`'s members, in group-rank order: entry i is group rank i."""
    return [global_rank(group, r) for r in range(group_size(group))]


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _wire(kind: str, tensor: torch.Tensor, group=None) -> torch.Tensor:
    """What torch.distributed moves for a message of `tensor`: the tensor itself, or, where
    it must travel elsewhere (a CUDA tensor on a gloo group, `wire_device`), a host copy to
    send or an empty host buffer to receive into (copied back once the message is complete)."""
    device = wire_device(tensor, group)                 # a host tensor's own device, without asking the group
    if device == tensor.device:
        return tensor
    return tensor.to(device) if kind == "send" else torch.empty_like(tensor, device=device)


_TRANSPORT = None   # post(ops, group) -> works of the messages' layer, when not torch.distributed's own


def set_transport(post_fn) -> None:
    """Send every message of this process through `post_fn(ops, group)` (ops: [(kind
    "send"/"recv", tensor, global peer, tag)], one work per op, each with wait(), `start`
    and `end`), or through torch.distributed again with None. The emulated cluster plugs
    its message layer in here when a worker starts (`ddnb.emulate.activate`) and takes it
    out when it stops, so this module never asks whether it is emulated."""
    global _TRANSPORT
    _TRANSPORT = post_fn


def send(tensor: torch.Tensor, dst: int, group=None, tracer: Tracer | None = None, name: str = "send") -> None:
    if _TRANSPORT is not None:
        return isend(tensor, dst, group, tracer, name).wait()
    start = time.time()
    dist.send(_wire("send", tensor, group), global_rank(group, dst), group=group)
    get_tracer(tracer).record("send", name, start, time.time(), peer=dst, nbytes=nbytes(tensor))


def recv(tensor: torch.Tensor, src: int, group=None, tracer: Tracer | None = None, name: str = "recv") -> None:
    if _TRANSPORT is not None:
        return irecv(tensor, src, group, tracer, name).wait()
    start = time.time()
    wire = _wire("recv", tensor, group)
    dist.recv(wire, global_rank(group, src), group=group)
    if wire is not tensor:
        tensor.copy_(wire)
    get_tracer(tracer).record("recv", name, start, time.time(), peer=src, nbytes=nbytes(tensor))


class Pending:
    """A posted send or receive of `tensor` (kept alive until it completes); `wait()`
    completes it and records its event, from posting to completion, unless `record()`
    already has. `extra`: more fields for the event (e.g. microbatch=3). `wire`: the host
    buffer a receive landed in when `tensor` could not travel itself (`_wire`), copied
    into `tensor` by `wait()`; for a send, its host copy (kept alive)."""

    def __init__(self, work, kind, name, peer, size, tracer, start=None, tensor=None, extra=None, wire=None):
        self.work, self.kind, self.name, self.peer, self.size = work, kind, name, peer, size
        self.tracer, self.tensor, self.extra, self.wire = tracer, tensor, extra or {}, wire
        self.start = time.time() if start is None else start
        self.start = getattr(work, "start", self.start)     # emulated: the emulated time it left
        self.done = self.recorded = False

    def wait(self, timeout: float | None = None) -> None:
        """Complete the message (within `timeout` s, else RuntimeError; a wait that times
        out breaks the group's connections) and record its event. Waiting again is a no-op."""
        if not self.done:
            if timeout is None:
                self.work.wait()
            else:
                self.work.wait(timeout=timedelta(seconds=timeout))
            if self.kind == "recv" and self.wire is not None and self.wire is not self.tensor:
                self.tensor.copy_(self.wire)
            self.done = True
            self.record()

    def record(self) -> None:
        """Record the event now, ending now, once: for a send traced as its posting only,
        completed later by `wait()`."""
        if not self.recorded:
            self.recorded = True
            end = getattr(self.work, "end", None)        # emulated: when it left the link / arrived
            get_tracer(self.tracer).record(self.kind, self.name, self.start, time.time() if end is None else end,
                                           peer=self.peer, nbytes=self.size, **self.extra)


def isend(tensor, dst, group=None, tracer=None, name="send") -> Pending:
    if _TRANSPORT is not None:
        return post([Op("send", tensor, dst, name=name)], group, tracer)[0]
    wire = _wire("send", tensor, group)
    return Pending(dist.isend(wire, global_rank(group, dst), group=group), "send", name, dst, nbytes(tensor),
                   tracer, tensor=tensor, wire=wire)


def irecv(tensor, src, group=None, tracer=None, name="recv") -> Pending:
    if _TRANSPORT is not None:
        return post([Op("recv", tensor, src, name=name)], group, tracer)[0]
    wire = _wire("recv", tensor, group)
    return Pending(dist.irecv(wire, global_rank(group, src), group=group), "recv", name, src, nbytes(tensor),
                   tracer, tensor=tensor, wire=wire)


class Op(NamedTuple):
    """One message of a `post`: kind "send" (to `peer`) or "recv" (from `peer`, a rank of
    the group), its tensor, its tag (gloo matches a receive to the send of the same tag),
    and how it is traced: `name` (default: the kind) and `extra` event fields."""

    kind: str
    tensor: torch.Tensor
    peer: int
    tag: int = 0
    name: str = ""
    extra: dict | None = None


def post(ops: list[Op], group=None, tracer: Tracer | None = None) -> list[Pending]:
    """Post every message of `ops` at once, with batch_isend_irecv, so that neither side
    waits for the other to post first; returns one Pending per op, in order. Nothing is
    waited for here."""
    if not ops:
        return []
    wires = [_wire(op.kind, op.tensor, group) for op in ops]
    if _TRANSPORT is not None:
        works = _TRANSPORT([(op.kind, w, global_rank(group, op.peer), op.tag) for op, w in zip(ops, wires)], group)
        return [Pending(work, op.kind, op.name or op.kind, op.peer, nbytes(op.tensor), tracer, tensor=op.tensor,
                        extra=op.extra, wire=w) for work, op, w in zip(works, ops, wires)]
    p2p_ops = [dist.P2POp(dist.isend if op.kind == "send" else dist.irecv, w, global_rank(group, op.peer),
                          group=group, tag=op.tag) for op, w in zip(ops, wires)]
    start = time.time()
    works = dist.batch_isend_irecv(p2p_ops)
    works = works if len(works) == len(ops) else [works[0]] * len(ops)   # one coalesced work (NCCL)
    return [Pending(work, op.kind, op.name or op.kind, op.peer, nbytes(op.tensor), tracer, start=start,
                    tensor=op.tensor, extra=op.extra, wire=w) for work, op, w in zip(works, ops, wires)]


def exchange(send_tensor: torch.Tensor | None, dst: int | None, recv_tensor: torch.Tensor | None,
             src: int | None, group=None, tracer: Tracer | None = None, name: str = "") -> None:
    """Send to `dst` and receive from `src` at the same time (either may be None) and wait
    for both: the deadlock-free step every ring and butterfly algorithm is made of."""
    ops = []
    if send_tensor is not None and dst is not None:
        ops.append(Op("send", send_tensor, dst, name=name))
    if recv_tensor is not None and src is not None:
        ops.append(Op("recv", recv_tensor, src, name=name))
    for pending in post(ops, group, tracer):
        pending.wait()
