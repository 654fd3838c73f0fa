"""Timing a collective on every rank the way benchmarks do (nccl-tests, OSU): warm up,
line the ranks up with a barrier, time `iters` calls, and report the slowest rank's
mean, since a collective is finished only when its last rank is. In an emulated cluster
(`ddnb.emulate`) the barrier and the clock are the emulated ones, so the time is emulated
seconds of its profile.
Taught in `notebooks/00_getting_started.ipynb`; used by `ddnb.bench`."""
from __future__ import annotations

import time

from ddnb._checks import Checks


def time_collective(op, numel: int, iters: int = 10, warmup: int = 2, dtype=None, group=None) -> float:
    """Seconds per call of op(tensor) on a tensor of `numel` elements, the slowest rank's
    mean over `iters` calls. Call it on every rank of the group at once."""
    import torch
    import torch.distributed as dist

    from ddnb.emulate import uncounted

    with Checks("time_collective") as check:
        check.integer("numel", numel, min=0)
        check.integer("iters", iters, min=1)
        check.integer("warmup", warmup, min=0)
    # with nccl in the group ("nccl" or "cpu:gloo,cuda:nccl") time it on this rank's GPU
    device = torch.device("cuda", torch.cuda.current_device()) if "nccl" in dist.get_backend(group) else "cpu"
    x = torch.ones(numel, dtype=dtype or torch.float32, device=device)
    barrier, clock = barrier_and_clock()
    for _ in range(warmup):
        op(x)
    _sync(device)
    barrier(group=group)
    t0 = clock()
    for _ in range(iters):
        op(x)
    _sync(device)
    elapsed = torch.tensor([(clock() - t0) / iters], dtype=torch.float64, device=device)
    with uncounted():                       # bookkeeping, after the timed calls
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
    return elapsed.item()


def time_allreduce(numel: int, iters: int = 10, warmup: int = 2) -> float:
    """torch.distributed.all_reduce on a float32 tensor of `numel` elements, in seconds
    (through `ddnb.collectives.traced`: in an emulated cluster, the time of the ring's
    messages, `ddnb.emulate.messages`)."""
    from ddnb.collectives import traced
    from ddnb.trace import Tracer

    quiet = Tracer(enabled=False)
    return time_collective(lambda t: traced.all_reduce(t, tracer=quiet), numel, iters, warmup)


def barrier_and_clock():
    """(barrier, clock): torch.distributed's barrier and time.perf_counter, or in an
    emulated cluster the emulated ones."""
    from ddnb.emulate import current

    em = current()
    if em is None:
        import torch.distributed as dist

        return (lambda group=None: dist.barrier(group=group)), time.perf_counter
    from ddnb.emulate import messages

    return messages.barrier, em.now


def _sync(device) -> None:
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize()
