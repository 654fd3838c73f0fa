"""Messages and collectives in emulated time, with real bytes.

`ddnb.collectives.p2p` sends through these when the process is emulating. Each message
is the real tensor, sent with torch.distributed as in real mode, preceded by a 16-byte
header (float64: the emulated time the message left, its size) on the same pair of
ranks; pairs deliver in order, so the header always precedes its payload. The receiver
computes the arrival time from the header and its own incoming link
(`Emulator.arrival`). All peers here are global ranks.

torch.distributed's own collectives (the traced layer's all-reduce, all-gather and barrier,
DDP's buckets) run for real too, so their values are torch's; their emulated time is that
of the messages of the algorithm they run, sent for real through this layer on a copy:
ddnb's ring all-reduce and all-gather (gloo's and NCCL's algorithm for large tensors;
`ddnb.collectives.ring`) and a dissemination barrier. The model they are compared with
(2(N-1) alpha + 2(N-1)/N n/B for the ring, Thakur, Rabenseifner & Gropp 2005, Sec. 4,
`ddnb.cost`) is nowhere used to time them: a comparison tests the messages' count, sizes
and order. Taught in `notebooks/05_allreduce.ipynb`.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ddnb.emulate.clock import current
from ddnb.emulate.compute import uncounted


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _header(start: float, nbytes: int) -> torch.Tensor:
    return torch.tensor([start, float(nbytes)], dtype=torch.float64)


class EmulatedWork:
    """One posted emulated message. `start`: the emulated time it left (a send) or was
    posted (a receive); `end`: when its bytes left this rank's link (a send, known at
    posting) or arrived (a receive, known after wait). wait() completes it in real and
    emulated time and returns (start, end)."""

    def __init__(self, works, start, end=None, finish=None):
        self.works, self.start, self.end, self.finish, self.done = works, start, end, finish, False

    def wait(self, timeout=None):
        if not self.done:
            for w in self.works:
                w.wait() if timeout is None else w.wait(timeout=timeout)
            self.end = self.finish()
            self.done = True
        return self.start, self.end

    def is_completed(self) -> bool:
        return self.done


def post(ops, group=None) -> list[EmulatedWork]:
    """Post messages [(kind "send"/"recv", tensor, global peer, tag), ...] at once (one
    batch_isend_irecv), each preceded by its header; one EmulatedWork per message."""
    em = current()
    if any(kind == "send" for kind, *_ in ops):
        em.sync()                         # a message leaves at its emulated time, not earlier
    p2p_ops, out, batch = [], [], []
    for kind, tensor, peer, tag in ops:
        n = _nbytes(tensor)
        if kind == "send":
            start, end = em.send_start(peer, n)
            p2p_ops += [dist.P2POp(dist.isend, _header(start, n), peer, group=group, tag=tag),
                        dist.P2POp(dist.isend, tensor, peer, group=group, tag=tag)]
            out.append(EmulatedWork(batch, start, end, finish=lambda end=end: (em.advance_to(end), end)[1]))
        else:
            header = torch.empty(2, dtype=torch.float64)
            p2p_ops += [dist.P2POp(dist.irecv, header, peer, group=group, tag=tag),
                        dist.P2POp(dist.irecv, tensor, peer, group=group, tag=tag)]

            def finish(header=header, peer=peer):
                arrival = em.arrival(peer, header[0].item(), int(header[1].item()))
                em.advance_to(arrival)
                return arrival
            out.append(EmulatedWork(batch, em.t, finish=finish))
    with uncounted():
        works = dist.batch_isend_irecv(p2p_ops)
    for k, w in enumerate(out):      # each message waits for its own header and payload
        w.works = works[2 * k:2 * k + 2] if len(works) == len(p2p_ops) else works[:1]
    return out


# ---------------------------------------------------------------- torch.distributed's collectives
# One message per chunk and ring step (as NCCL's ring with a chunk no larger than its
# buffer); a smaller segment sends more, smaller messages (`ddnb.collectives.ring`).
SEGMENT_BYTES = 1 << 62


def _ring_time(scratch: torch.Tensor, launch: float, group, gather: bool = False) -> float:
    """Run the ring all-reduce (or all-gather) of `scratch` over the message layer on this
    rank's collective `stream` from `launch`; returns its end on this rank. The ring's
    reductions are not charged (gamma = 0, as in the model it is compared with)."""
    from ddnb.collectives.ring import ring_allgather, ring_allreduce
    from ddnb.emulate.compute import paused
    from ddnb.trace import Tracer

    em, quiet = current(), Tracer(enabled=False)
    with em.stream(launch) as t, paused():
        if gather:
            ring_allgather(scratch, group=group, tracer=quiet, check=False, segment_bytes=SEGMENT_BYTES)
        else:
            ring_allreduce(scratch, group=group, tracer=quiet, check=False, segment_bytes=SEGMENT_BYTES)
    return t[0]


def all_reduce(tensor: torch.Tensor, op=dist.ReduceOp.SUM, group=None) -> None:
    """dist.all_reduce, for real, in the emulated time of the ring's messages
    (`EmulatedAllReduce`, waited)."""
    EmulatedAllReduce(tensor, group, op).wait()


class EmulatedAllReduce:
    """dist.all_reduce(tensor, async_op=True) in emulated time. The values are torch's (the
    real all-reduce runs on gloo's thread), so an emulated run trains bit for bit as a real
    one; the time is that of ddnb's ring all-reduce (`ddnb.collectives.ring`, Patarasuk &
    Yuan 2009) run over the message layer on a copy of the tensor taken at launch: 2(N-1)
    real messages per rank, each alpha + n/B on its links, on the rank's collective
    `stream` from its launch, so buckets queue behind each other and overlap the backward
    compute after them. `wait()` sends those messages (in the rank's own thread) and
    moves this rank's clock to the ring's end. `launch`, `end`: emulated seconds."""

    def __init__(self, tensor: torch.Tensor, group=None, op=dist.ReduceOp.SUM):
        from ddnb.emulate.compute import paused

        self.em = em = current()
        self.launch = em.sync()
        self.tensor, self.group, self.end = tensor, group, None
        with paused():
            self._scratch = tensor.detach().clone()        # the ring's bytes, as launched
        with uncounted(), paused():
            self.work = dist.all_reduce(tensor, op=op, group=group, async_op=True)

    def is_completed(self) -> bool:
        return self.end is not None

    def wait(self, timeout=None) -> bool:
        if self.end is None:
            self.work.wait()
            n = dist.get_world_size(self.group)
            self.end = _ring_time(self._scratch, self.launch, self.group) if n > 1 else self.launch
            self._scratch = None
            self.em.advance_to(self.end)
        return True

    def get_future(self):
        """A torch Future completed with [tensor] once the all-reduce is done for real (what
        a DDP communication hook returns). The ring's messages are sent in the rank's own
        thread at the end of the backward pass (an autograd final callback, after DDP's
        reducer has launched every bucket, in the order launched: the same on every rank),
        and the clock moves to max(end of backward's compute, end of each bucket). Outside
        a backward pass, at once."""
        pending = getattr(self.em, "pending_collectives", None)
        if pending is None:
            try:
                torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
                pending = self.em.pending_collectives = []
            except RuntimeError:              # not in a backward pass
                self.wait()
                pending = None
        if pending is not None:
            pending.append(self)
        return self.work.get_future().then(lambda _: self.tensor)

    def _end_of_backward(self) -> None:
        pending, self.em.pending_collectives = self.em.pending_collectives, None
        for work in pending:
            work.wait()


def ddp_comm_hook(group, bucket):
    """A DDP communication hook (`model.register_comm_hook(None, ddp_comm_hook)`): the
    average of the bucket's gradients as DDP computes it without a hook (its reducer
    multiplies each gradient by 1/N before the all-reduce; dividing by N would differ in
    the last bit), in emulated time (`EmulatedAllReduce`)."""
    buffer = bucket.buffer()
    buffer.mul_(1.0 / dist.get_world_size(group))
    return EmulatedAllReduce(buffer, group).get_future()


def all_gather(out: torch.Tensor, tensor: torch.Tensor, group=None) -> None:
    """`ddnb.compat.all_gather_single(out, tensor)`, for real, in the emulated time of the
    ring all-gather's messages (`ddnb.collectives.ring.ring_allgather` over the message
    layer: N-1 messages of S bytes per rank) run on a copy."""
    from ddnb.compat import all_gather_single
    from ddnb.emulate.compute import paused

    em = current()
    launch = em.sync()
    with uncounted(), paused():       # the real collective's own copies are not the cluster's compute
        all_gather_single(out, tensor, group=group)
    if dist.get_world_size(group) > 1:
        with paused():
            scratch = out.detach().clone()
        em.advance_to(_ring_time(scratch, launch, group, gather=True))


def _on_stream(launch: float, algorithm, *args, group=None) -> float:
    """Run ddnb's `algorithm(*args, group=..., tracer=..., check=False)` over the message
    layer on this rank's collective stream from `launch`; returns its end on this rank."""
    from ddnb.emulate.compute import paused
    from ddnb.trace import Tracer

    em = current()
    with em.stream(launch) as t, paused():
        algorithm(*args, group=group, tracer=Tracer(enabled=False), check=False)
    return t[0]


def reduce_scatter(out: torch.Tensor, chunks: list, group=None) -> None:
    """dist.reduce_scatter(out, chunks), for real, in the emulated time of ddnb's ring
    reduce-scatter's messages (`ddnb.collectives.ring.ring_reduce_scatter`: N-1 steps) run
    on a copy of the concatenated chunks."""
    from ddnb.collectives.ring import ring_reduce_scatter
    from ddnb.emulate.compute import paused

    em = current()
    launch = em.sync()
    with uncounted(), paused():
        scratch = torch.cat([c.reshape(-1) for c in chunks])
        dist.reduce_scatter(out, chunks, group=group)
    if dist.get_world_size(group) > 1:
        em.advance_to(_on_stream(launch, lambda x, **kw: ring_reduce_scatter(
            x, segment_bytes=SEGMENT_BYTES, **kw), scratch, group=group))


def broadcast(tensor: torch.Tensor, src: int = 0, group=None) -> None:
    """dist.broadcast, for real, in the emulated time of ddnb's binomial-tree broadcast's
    messages (`ddnb.collectives.tree.broadcast`: ceil(log2 N) rounds) run on a copy."""
    from ddnb.collectives.p2p import global_rank
    from ddnb.collectives.tree import broadcast as tree_broadcast
    from ddnb.emulate.compute import paused

    em = current()
    launch = em.sync()
    with uncounted(), paused():
        scratch = tensor.detach().clone()
        dist.broadcast(tensor, global_rank(group, src), group=group)
    if dist.get_world_size(group) > 1:
        em.advance_to(_on_stream(launch, lambda x, **kw: tree_broadcast(x, src, **kw), scratch, group=group))


def all_to_all(out: torch.Tensor, tensor: torch.Tensor, group=None) -> None:
    """dist.all_to_all_single(out, tensor), for real, in the emulated time of ddnb's
    pairwise all-to-all's messages (`ddnb.collectives.all_to_all`: N-1 rounds) run on a copy."""
    from ddnb.collectives.all_to_all import all_to_all as pairwise
    from ddnb.emulate.compute import paused

    em = current()
    launch = em.sync()
    with uncounted(), paused():
        scratch_in, scratch_out = tensor.detach().clone(), torch.empty_like(out)
        dist.all_to_all_single(out, tensor, group=group)
    if dist.get_world_size(group) > 1:
        em.advance_to(_on_stream(launch, pairwise, scratch_out, scratch_in, group=group))


def barrier(group=None) -> float:
    """dist.barrier as a dissemination barrier over the message layer (Hensgen, Finkel &
    Manber 1988): in round k every rank sends one byte to rank + 2^k and waits for the one
    from rank - 2^k, ceil(log2 N) rounds, so no rank leaves before the last has arrived.
    Returns the emulated time it left."""
    from ddnb.collectives import p2p
    from ddnb.emulate.compute import paused
    from ddnb.trace import Tracer

    em = current()
    n, rank = p2p.group_size(group), p2p.group_rank(group)
    with paused():
        out, into = torch.zeros(1, dtype=torch.uint8), torch.empty(1, dtype=torch.uint8)
    quiet, k = Tracer(enabled=False), 1
    while k < n:
        p2p.exchange(out, (rank + k) % n, into, (rank - k) % n, group=group, tracer=quiet)
        k *= 2
    return em.sync()
