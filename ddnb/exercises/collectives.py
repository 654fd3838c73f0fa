"""Checkers for the collectives chapters (03, 05): the learner's all-reduce, run on real
processes against the sum every rank should end with.
Taught in `notebooks/05_allreduce.ipynb`.
"""
from __future__ import annotations

import torch

from ddnb.exercises.core import check_sized_call, compare, passed, run_on_ranks


def _rank_input(rank: int, numel: int) -> torch.Tensor:
    """(numel,) float64 with distinct values per rank and element: 100·(rank+1) + index."""
    return torch.arange(numel, dtype=torch.float64) + 100.0 * (rank + 1)


def _run_allreduce(fn, numel: int):
    import torch.distributed as dist

    x = _rank_input(dist.get_rank(), numel)
    out = fn(x)
    return x, out


def diagnose_allreduce(got: torch.Tensor, mine: torch.Tensor, total: torch.Tensor, rank: int, n: int) -> str:
    """What a wrong all-reduce result usually means (the hint of `check_allreduce`)."""
    if torch.equal(got, mine):
        return (f"rank {rank}'s tensor is unchanged: write the result into `tensor` in place "
                f"(tensor.copy_(...) or tensor[...] = ...); a new tensor is not seen by the caller")
    if torch.allclose(got, total / n):
        return "every element is the mean: the exercise asks for the sum (divide only for op='avg')"
    chunks = torch.arange(got.numel()).tensor_split(n)
    own = chunks[rank] if rank < len(chunks) else chunks[0]
    if own.numel() and torch.allclose(got[own], total[own]) and not torch.allclose(got, total):
        return (f"rank {rank} holds the sum only in its own chunk (elements {own[0].item()}..{own[-1].item()}): "
                f"did the all-gather phase run?")
    for k in range(2, n + 1):
        if torch.allclose(got, k * total):
            return f"every element is {k}x the sum: a chunk was added more than once"
    return "the partial sums are wrong: check which chunk each step sends and which it adds into"


def check_allreduce(fn, world_size: int = 3, sizes=(1, 7, 12, 64), timeout: float = 30) -> str:
    """Run `fn(tensor)`, an in-place sum all-reduce of a 1-D float tensor (the default
    process group), on `world_size` real processes for each size in `sizes` (sizes not
    divisible by world_size included), and compare every rank's tensor with the sum.
    Accepts `dist.all_reduce`. Returns the success line; raises AssertionError with a hint
    at the first rank and element that differ, or when fn hangs (deadline) or raises."""
    check_sized_call("check_allreduce", fn, world_size, sizes, min_world=1)
    for numel in sizes:
        results = run_on_ranks(_run_allreduce, world_size, fn, numel, what=getattr(fn, "__name__", "fn"),
                               timeout=timeout)
        total = sum(_rank_input(r, numel) for r in range(world_size))
        for rank, (got, _) in enumerate(results):
            mine = _rank_input(rank, numel)
            hint = diagnose_allreduce(got, mine, total, rank, world_size) if not torch.allclose(got, total) else ""
            compare(got, total, rank=rank, name=f"all-reduce of {numel} element(s)", hint=hint)
    return passed("check_allreduce", f"every rank holds the sum on {world_size} processes, sizes {list(sizes)}")
