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


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _header(start: float, nbytes: int) -> torch.Tensor:
    return torch.tensor([start, float(nbytes)], dtype=torch.float64)


class EmulatedWork:
    """A posted emulated isend or irecv; wait() completes it in real and emulated time and
    returns (start, end) in emulated seconds."""

    def __init__(self, works, finish):
        self.works, self.finish, self.result = works, finish, None

    def wait(self):
        if self.result is None:
            for w in self.works:
                w.wait()
            self.result = self.finish()
        return self.result


def isend(tensor: torch.Tensor, dst: int, group=None) -> EmulatedWork:
    em = current()
    em.sync()
    start, end = em.send_start(dst, _nbytes(tensor))
    works = [dist.isend(_header(start, _nbytes(tensor)), dst, group=group), dist.isend(tensor, dst, group=group)]

    def finish():
        em.advance_to(end)          # the buffer is free once its bytes are on the wire
        return start, end
    return EmulatedWork(works, finish)


def irecv(tensor: torch.Tensor, src: int, group=None) -> EmulatedWork:
    em = current()
    posted = em.t
    header = torch.empty(2, dtype=torch.float64)
    works = [dist.irecv(header, src, group=group), dist.irecv(tensor, src, group=group)]

    def finish():
        arrival = em.arrival(src, header[0].item(), int(header[1].item()))
        em.advance_to(arrival)
        return posted, arrival
    return EmulatedWork(works, finish)


def send(tensor, dst, group=None):
    return isend(tensor, dst, group).wait()


def recv(tensor, src, group=None):
    return irecv(tensor, src, group).wait()


def exchange(send_tensor, dst, recv_tensor, src, group=None) -> list[tuple[float, float]]:
    """Send and receive at once (batch_isend_irecv, as p2p.exchange does); the (start,
    end) of each, the send first."""
    em = current()
    ops, finishes = [], []
    if send_tensor is not None:
        em.sync()
        start, end = em.send_start(dst, _nbytes(send_tensor))
        ops += [dist.P2POp(dist.isend, _header(start, _nbytes(send_tensor)), dst, group=group),
                dist.P2POp(dist.isend, send_tensor, dst, group=group)]
        finishes.append(lambda: (em.advance_to(end), (start, end))[1])
    if recv_tensor is not None:
        posted, header = em.t, torch.empty(2, dtype=torch.float64)
        ops += [dist.P2POp(dist.irecv, header, src, group=group),
                dist.P2POp(dist.irecv, recv_tensor, src, group=group)]

        def finish_recv():
            arrival = em.arrival(src, header[0].item(), int(header[1].item()))
            em.advance_to(arrival)
            return posted, arrival
        finishes.append(finish_recv)
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return [f() for f in finishes]


# ---------------------------------------------------------------- torch.distributed's collectives
def _started_together(group=None) -> float:
    """Sync, then the emulated time at which the last rank of `group` arrived (a real
    MAX all-reduce of the ranks' times)."""
    em = current()
    t = torch.tensor([em.sync()], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.item()


def _slowest_link(group=None):
    em = current()
    ranks = dist.get_process_group_ranks(group) if group is not None else range(dist.get_world_size())
    hosts = {em.profile.host(r) for r in ranks}
    return em.profile.inter if len(hosts) > 1 else em.profile.intra


def all_reduce(tensor: torch.Tensor, op=dist.ReduceOp.SUM, group=None) -> None:
    """dist.all_reduce, for real; its emulated time is the ring's alpha-beta time on the
    group's slowest link, from when the last rank called it."""
    from ddnb.cost import allreduce_time

    em = current()
    start = _started_together(group)
    dist.all_reduce(tensor, op=op, group=group)
    n, link = dist.get_world_size(group), _slowest_link(group)
    end = start + (allreduce_time("ring", _nbytes(tensor), n, link.alpha, 1 / link.bandwidth, 0.0) if n > 1 else 0)
    em.advance_to(end)
    em.occupy_links(end)


def barrier(group=None) -> float:
    """dist.barrier, in emulated time: every rank leaves at the last arrival plus
    ceil(log2 N) latencies (a dissemination barrier: Hensgen, Finkel & Manber 1988).
    Returns the time it left."""
    em = current()
    n = dist.get_world_size(group)
    end = _started_together(group) + math.ceil(math.log2(n)) * _slowest_link(group).alpha if n > 1 else em.t
    em.advance_to(end)
    return em.sync()
