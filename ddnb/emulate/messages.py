"""Messages and collectives in emulated time, with real bytes.

`ddnb.collectives.p2p` sends through these when the process is emulating. Each message
is the real tensor, sent with torch.distributed as in real mode, preceded by a 16-byte
header (float64: the emulated time the message left, its size) on the same pair of
ranks; pairs deliver in order, so the header always precedes its payload. The receiver
computes the arrival time from the header and its own incoming link
(`Emulator.arrival`). All peers here are global ranks.

torch.distributed's own collectives run for real too; their emulated time is the
alpha-beta model of the algorithm they run (gloo's and NCCL's ring for a large all-reduce:
2(N-1) alpha + 2(N-1)/N n/B, Thakur, Rabenseifner & Gropp 2005, Sec. 4 (`ddnb.cost`)),
starting when the last rank has called it. That time is the model's by construction and
is labelled so wherever it is shown. Taught in `notebooks/05_allreduce.ipynb`.
"""
from __future__ import annotations

import math

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
def _started_together(group=None) -> float:
    """Sync, then the emulated time at which the last rank of `group` arrived (a real
    MAX all-reduce of the ranks' times)."""
    em = current()
    t = torch.tensor([em.sync()], dtype=torch.float64)
    with uncounted():
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.item()


def _slowest_link(group=None):
    em = current()
    ranks = dist.get_process_group_ranks(group) if group is not None else range(dist.get_world_size())
    hosts = {em.profile.host(r) for r in ranks}
    return em.profile.inter if len(hosts) > 1 else em.profile.intra


def all_reduce(tensor: torch.Tensor, op=dist.ReduceOp.SUM, group=None) -> None:
    """dist.all_reduce, for real; its emulated time is the ring's alpha-beta time on the
    group's slowest link, from when the last rank called it (`EmulatedAllReduce`, waited)."""
    EmulatedAllReduce(tensor, group, op).wait()


class EmulatedAllReduce:
    """dist.all_reduce(tensor, async_op=True) in emulated time: launched at this rank's
    emulated time, it starts when the last rank has launched it and this rank's links are
    free (so buckets queue behind each other on the link), and takes the ring's alpha-beta
    time. The real all-reduce runs on gloo's thread meanwhile; `wait()` completes both and
    moves this rank's clock to the end. `launch`, `end`: emulated seconds."""

    def __init__(self, tensor: torch.Tensor, group=None, op=dist.ReduceOp.SUM):
        self.em = em = current()
        self.launch = em.sync()
        self.tensor, self.group, self.end = tensor, group, None
        self._last = torch.tensor([self.launch], dtype=torch.float64)
        with uncounted():
            self.works = [dist.all_reduce(self._last, op=dist.ReduceOp.MAX, group=group, async_op=True),
                          dist.all_reduce(tensor, op=op, group=group, async_op=True)]

    def is_completed(self) -> bool:
        return self.end is not None

    def wait(self, timeout=None, _from_callback: bool = False) -> bool:
        if self.end is None:
            for w in self.works[:1] if _from_callback else self.works:   # a work's own callback cannot wait on it
                w.wait()
            from ddnb.cost import allreduce_time

            n, link = dist.get_world_size(self.group), _slowest_link(self.group)
            cost = allreduce_time("ring", _nbytes(self.tensor), n, link.alpha, 1 / link.bandwidth, 0.0) if n > 1 else 0
            self.end = self.em.run_collective(self._last.item(), cost)
        return True

    def get_future(self):
        """A torch Future completed with [tensor] once the all-reduce is done for real (what
        a DDP communication hook returns). Its emulated end is taken in the rank's own
        thread at the end of the backward pass (an autograd final callback, after DDP's
        reducer has launched every bucket), so the clock is moved to max(end of backward's
        compute, end of each bucket's all-reduce) in program order, never by gloo's thread
        at a moment real time decides. Outside a backward pass, by gloo's thread."""
        pending = getattr(self.em, "pending_collectives", None)
        if pending is None:
            try:
                torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
                pending = self.em.pending_collectives = []
            except RuntimeError:              # not in a backward pass
                pending = None
        if pending is not None:
            pending.append(self)
            return self.works[1].get_future().then(lambda _: self.tensor)

        def done(_):
            self.wait(_from_callback=True)
            return self.tensor
        return self.works[1].get_future().then(done)

    def _end_of_backward(self) -> None:
        pending, self.em.pending_collectives = self.em.pending_collectives, None
        for work in pending:
            work.wait()


def ddp_comm_hook(group, bucket):
    """A DDP communication hook (`model.register_comm_hook(None, ddp_comm_hook)`): the
    average of the bucket's gradients, as DDP's default hook computes it, in emulated
    time (`EmulatedAllReduce`)."""
    buffer = bucket.buffer()
    buffer.div_(dist.get_world_size(group))
    return EmulatedAllReduce(buffer, group).get_future()


def all_gather(out: torch.Tensor, tensor: torch.Tensor, group=None) -> None:
    """`ddnb.compat.all_gather_single(out, tensor)`, for real; its emulated time is the ring
    all-gather's (N-1)(alpha + S/B) for S bytes per rank (Thakur, Rabenseifner & Gropp 2005,
    Sec. 4: (p-1) alpha + (p-1)/p n beta with n = N S gathered), from when the last rank
    called it, on the group's slowest link."""
    from ddnb.compat import all_gather_single

    em = current()
    last = _started_together(group)
    with uncounted():
        all_gather_single(out, tensor, group=group)
    n, link = dist.get_world_size(group), _slowest_link(group)
    em.run_collective(last, (n - 1) * link.time(_nbytes(tensor)))


def barrier(group=None) -> float:
    """dist.barrier, in emulated time: every rank leaves at the last arrival plus
    ceil(log2 N) latencies (a dissemination barrier: Hensgen, Finkel & Manber 1988).
    Returns the time it left."""
    em = current()
    n = dist.get_world_size(group)
    end = _started_together(group) + math.ceil(math.log2(n)) * _slowest_link(group).alpha if n > 1 else em.t
    em.advance_to(end)
    return em.sync()
