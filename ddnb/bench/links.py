"""Measuring the alpha-beta-gamma model's parameters on live processes (`ddnb.cost.alpha_beta`
holds the model and its fit; nothing there starts or talks to a process). Call each
function on every rank of a world at once:

    pingpong(sizes)        one-way seconds of a message between ranks 0 and 1, one link alone
    sendrecv(sizes)        a shift in which every rank sends to rank + 1 at once (the ring's step)
    measure_gamma()        seconds per byte of a local float32 add (the reduction)
    pair_exchange(size)    a pairwise swap step and its CPU time, as more ranks than cores share it

The Intel MPI Benchmarks' PingPong and Sendrecv patterns; Thakur, Rabenseifner & Gropp
2005 (Sec. 4) for the model they parameterize. Taught in `notebooks/05_allreduce.ipynb`
and `notebooks/12_scalability.ipynb`; `python -m ddnb.bench allreduce --fit` fits the
model to them.
"""
from __future__ import annotations

import time

from ddnb._checks import Checks


def _p2p_args(what: str, sizes_bytes, iters: int, warmup: int, group) -> tuple[list[int], int, int]:
    """Validate a point-to-point measurement's arguments: (sizes, world_size, rank)."""
    import torch.distributed as dist

    sizes = [int(s) for s in sizes_bytes]
    if any(s < 0 or s % 4 for s in sizes) or iters < 1 or warmup < 0:
        raise ValueError(f"need sizes that are multiples of 4 bytes, iters >= 1, warmup >= 0; "
                         f"got sizes={sizes}, iters={iters}, warmup={warmup}")
    world_size, rank = dist.get_world_size(group), dist.get_rank(group)
    if world_size < 2:
        raise ValueError(f"{what} needs a world of >= 2 ranks, got world_size={world_size}")
    return sizes, world_size, rank


def pingpong(sizes_bytes, iters: int = 10, warmup: int = 2, group=None) -> list[float]:
    """One-way seconds of a message of each size between ranks 0 and 1 (of `group`).

    Call it on every rank of a world of >= 2 ranks. Rank 0 sends a message to rank 1,
    which sends it back; one-way time = round trip / 2, averaged over `iters` bounces
    after `warmup` (torch.distributed send/recv, the same messages the from-scratch
    collectives use). The other ranks wait. Every rank returns the same list: rank 0's
    times, broadcast to all. Sizes must be multiples of 4 (float32 messages).
    """
    import torch
    import torch.distributed as dist

    from ddnb.collectives import p2p
    from ddnb.collectives.ops import header_device
    from ddnb.emulate import uncounted
    from ddnb.collectives.devices import rank_device
    from ddnb.trace import Tracer

    sizes, world_size, rank = _p2p_args("pingpong", sizes_bytes, iters, warmup, group)
    barrier, clock = _device_clock()
    quiet = Tracer(enabled=False)
    times = torch.zeros(len(sizes), dtype=torch.float64, device=header_device(group))
    for i, size in enumerate(sizes):
        buf = torch.zeros(size // 4, dtype=torch.float32, device=rank_device())   # where the rank's data lives
        barrier(group=group)
        if rank in (0, 1):
            peer = 1 - rank
            for it in range(warmup + iters):
                if it == warmup:
                    t0 = clock()
                if rank == 0:
                    p2p.send(buf, peer, group=group, tracer=quiet)
                    p2p.recv(buf, peer, group=group, tracer=quiet)
                else:
                    p2p.recv(buf, peer, group=group, tracer=quiet)
                    p2p.send(buf, peer, group=group, tracer=quiet)
            times[i] = (clock() - t0) / iters / 2
    with uncounted():                       # bookkeeping, after the timed messages
        dist.broadcast(times, p2p.global_rank(group, 0), group=group)
    return times.tolist()


def _device_clock():
    """(barrier, clock) of `ddnb.timing.barrier_and_clock`, the clock reading after the
    rank's GPU has finished what it was given (nccl's waits return once the copy is queued
    on the stream, not done), so that a link fitted on a GPU cluster is the one its tensors
    use (nccl), not the host's (gloo)."""
    from ddnb.collectives.devices import rank_device
    from ddnb.timing import barrier_and_clock, _sync

    barrier, clock = barrier_and_clock()
    device = rank_device()
    if device.type != "cuda":
        return barrier, clock

    def synced():
        _sync(device)
        return clock()
    return barrier, synced


def sendrecv(sizes_bytes, iters: int = 10, warmup: int = 2, group=None) -> list[float]:
    """Seconds per step of a shift in which *every* rank sends a message of each size to
    rank + 1 and receives one from rank - 1 at the same time (the "Sendrecv" benchmark of
    the Intel MPI Benchmarks): the slowest rank's mean, the same list on every rank.

    This is the traffic of one step of the ring (and of halving-doubling, where every
    rank swaps with a partner): all links busy at once (`ddnb.collectives.p2p.exchange`,
    as the ring sends). `pingpong` measures one link
    alone. The two agree on a network where links are independent, as the model assumes;
    on one machine, where every "link" is a copy through the same few cores, the busy
    links are slower, and fitting alpha, beta to these times gives that slower link.
    Call it on every rank of a world of >= 2 ranks; sizes must be multiples of 4.
    """
    import torch
    import torch.distributed as dist

    from ddnb.collectives import p2p
    from ddnb.collectives.ops import header_device
    from ddnb.emulate import uncounted
    from ddnb.collectives.devices import rank_device
    from ddnb.trace import Tracer

    sizes, world_size, rank = _p2p_args("sendrecv", sizes_bytes, iters, warmup, group)
    barrier, clock = _device_clock()
    quiet = Tracer(enabled=False)
    times = torch.zeros(len(sizes), dtype=torch.float64, device=header_device(group))
    for i, size in enumerate(sizes):
        out, inc = (torch.zeros(size // 4, device=rank_device()) for _ in range(2))  # (size/4,) float32 each
        barrier(group=group)
        for it in range(warmup + iters):
            if it == warmup:
                t0 = clock()
            p2p.exchange(out, (rank + 1) % world_size, inc, (rank - 1) % world_size, group=group, tracer=quiet)
        times[i] = (clock() - t0) / iters
    with uncounted():                       # bookkeeping, after the timed messages
        dist.all_reduce(times, op=dist.ReduceOp.MAX, group=group)
    return times.tolist()


def measure_gamma(nbytes: int = 16 << 20, iters: int = 10) -> float:
    """Seconds per byte of a local float32 add (a.add_(b), as the collectives reduce),
    on this process, with its current number of threads: the gamma of the model."""
    import torch

    with Checks("measure_gamma") as check:
        check.integer("nbytes", nbytes, min=4)
        check.integer("iters", iters, min=1)
    from ddnb.timing import barrier_and_clock

    clock = barrier_and_clock()[1]   # emulated: the add's modeled time
    a = torch.ones(nbytes // 4, dtype=torch.float32)
    b = torch.ones_like(a)
    a.add_(b)  # warm up: first touch of the pages
    t0 = clock()
    for _ in range(iters):
        a.add_(b)
    return (clock() - t0) / iters / (a.numel() * 4)


def pair_exchange(size_bytes: int, active: int | None = None, iters: int = 100, warmup: int = 5,
                  group=None) -> tuple[float, float]:
    """(seconds per step, CPU seconds per step summed over all ranks) of a step in which
    ranks 2k and 2k+1, among the first `active` ranks (default: all, an odd last rank
    idles), swap a message of `size_bytes` (isend + irecv, as halving-doubling does).

    What the alpha-beta model leaves out when several ranks share few cores: a message's
    latency alpha is taken as a constant of the link, but each wait here costs thread
    wake-ups (the caller's and gloo's I/O thread), so with more ranks exchanging at once
    than there are cores the steps queue for the CPU and both numbers grow. Compare
    active=2 with active=world_size. Call it on every rank; the same pair on every rank.
    """
    import resource

    import torch
    import torch.distributed as dist

    from ddnb.collectives.p2p import global_rank

    sizes, world_size, rank = _p2p_args("pair_exchange", [size_bytes], iters, warmup, group)
    active = world_size if active is None else active
    if not (isinstance(active, int) and 2 <= active <= world_size):
        raise ValueError(f"active must be an integer in 2..{world_size}, got active={active!r}")
    partner = rank ^ 1
    busy = rank < active and partner < active
    peer = global_rank(group, partner) if busy else None
    out, inc = torch.zeros(sizes[0] // 4), torch.zeros(sizes[0] // 4)  # (size/4,) float32 each

    def step():
        for work in (dist.isend(out, peer, group=group), dist.irecv(inc, peer, group=group)):
            work.wait()

    for _ in range(warmup if busy else 0):
        step()
    dist.barrier(group=group)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu0, t0 = usage.ru_utime + usage.ru_stime, time.perf_counter()
    for _ in range(iters if busy else 0):
        step()
    seconds = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = usage.ru_utime + usage.ru_stime - cpu0
    stats = torch.tensor([seconds / iters if busy else 0.0, cpu / iters], dtype=torch.float64)
    times = stats[:1].clone()
    dist.all_reduce(times, op=dist.ReduceOp.MAX, group=group)
    cpus = stats[1:].clone()
    dist.all_reduce(cpus, group=group)
    return times.item(), cpus.item()
