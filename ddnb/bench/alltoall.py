"""The all-to-all benchmark behind `python -m ddnb.bench alltoall`:

    python -m ddnb.bench alltoall --workers 4 --sizes 4KB..16MB
    ddnb bench alltoall --workers 4 --sizes 4KB,1MB --algorithms pairwise,torch --json

`alltoall` times ddnb's from-scratch all-to-alls (pairwise: `ddnb.collectives.all_to_all`,
bruck: `ddnb.collectives.bruck_all_to_all`) and torch.distributed's all_to_all_single
(gloo's) on a `ddnb.testing.World` of `--workers` gloo processes, for each size: the
bytes of one rank's float32 input, size/N of it to every rank (equal splits; a size is
rounded down to a multiple of 4N bytes). A call's time is measured as the all-reduce
benchmark measures it (`ddnb.bench.allreduce`: doubling probes, --repeats windows of
back-to-back calls, the slowest rank's mean, the median window). Also algbw = size /
time and busbw = algbw * (N-1)/N, nccl-tests' all-to-all definition
(doc/PERFORMANCE.md: the bytes that leave each rank), and each algorithm's busbw over
torch's at that size.

`alltoall_rows` returns the rows, `alltoall_benchmark` runs them in a world of its own as
the command does, and `ddnb.bench.allreduce.allreduce_table` prints them. Taught in
`notebooks/03_collectives.ipynb`.
"""
from __future__ import annotations

from ddnb.bench.allreduce import _timed, timed_rows
from ddnb.collectives import ALL_TO_ALLS

ALLTOALL_ALGORITHMS = tuple(ALL_TO_ALLS) + ("torch",)


def busbw_factor(workers: int) -> float:
    """(N-1)/N: busbw = algbw * this (nccl-tests, all-to-all)."""
    return (workers - 1) / workers


def elements(size: int, workers: int) -> int:
    """float32 elements of a rank's input of `size` bytes, rounded down to a multiple of
    `workers` (equal splits). Raises ValueError below 4·workers bytes (one element per rank)."""
    if size < 4 * workers:
        raise ValueError(f"size {size} B is below 4 * workers = {4 * workers} B: all-to-all needs at least one "
                         f"float32 element for every rank")
    return size // 4 // workers * workers


# ---------------------------------------------------------------- run on every rank
def rank_alltoall(algorithm: str, size: int, target_seconds: float, repeats: int = 3, max_iters: int = 10_000):
    """(seconds per all-to-all of `size` bytes of float32 per rank, iterations): the
    slowest rank's mean over `iters` calls, median of `repeats` windows (as
    `ddnb.bench.allreduce.rank_allreduce`). `size` must be a multiple of 4 · world size."""
    import torch

    from ddnb.timing import time_collective
    from ddnb.trace import Tracer

    out = torch.empty(size // 4)                               # (numel,): the output, reused
    if algorithm == "torch":   # through the one traced layer (emulated: timed by its messages)
        from ddnb.collectives import traced

        quiet = Tracer(enabled=False)
        op = lambda x: traced.all_to_all(out, x, tracer=quiet)  # noqa: E731
    else:
        fn, tracer = ALL_TO_ALLS[algorithm], Tracer(enabled=False)
        op = lambda x: fn(out, x, tracer=tracer, check=False)  # noqa: E731
    return _timed(lambda iters: time_collective(op, size // 4, iters=iters, warmup=1), target_seconds, max_iters,
                  repeats)


# ---------------------------------------------------------------- benchmarks -> rows
def alltoall_rows(world, sizes, algorithms=ALLTOALL_ALGORITHMS, target_seconds: float = 0.3, repeats: int = 3,
                  log=None) -> list[dict]:
    """One row per (size, algorithm), as `ddnb.bench.allreduce.allreduce_rows`: size (bytes
    of one rank's input, after `elements`' rounding), workers, algorithm, time (s), iters,
    algbw and busbw (GB/s), threads, ratio_vs_torch (busbw / torch's at that size)."""
    unknown = [a for a in algorithms if a not in ALLTOALL_ALGORITHMS]
    if unknown:
        raise ValueError(f"unknown all-to-all algorithms {unknown}; known: {', '.join(ALLTOALL_ALGORITHMS)}")
    sizes = [4 * elements(s, world.n) for s in sizes]          # every size checked before any run
    return timed_rows(world, sizes, algorithms, rank_alltoall, busbw_factor(world.n), target_seconds, repeats, log)


def alltoall_benchmark(workers: int, sizes, algorithms=ALLTOALL_ALGORITHMS, target_seconds: float = 0.3,
                       repeats: int = 3, timeout: float = 300, log=None) -> list[dict]:
    """What `python -m ddnb.bench alltoall` measures: `alltoall_rows` in a World of its own."""
    from ddnb.testing import World

    for s in sizes:
        elements(s, workers)                                   # bad sizes fail before the world starts
    with World(workers, timeout=timeout) as world:
        return alltoall_rows(world, sizes, algorithms, target_seconds, repeats, log=log)
