"""Checker for the first chapter (00): a function that every rank runs, returning the sum
of every rank's value through one all-reduce. Taught in `notebooks/00_getting_started.ipynb`.

    def total_over_ranks(value):            # runs on every rank
        t = torch.tensor([float(value)])
        dist.all_reduce(t)                  # a sum by default
        return t.item()
    check_sum_over_ranks(total_over_ranks, world_size=4)
"""
from __future__ import annotations

import torch

from ddnb._checks import Checks
from ddnb.exercises.core import passed, run_on_ranks

VALUES = (3.0, 5.0, 11.0, 17.0, 23.0, 29.0, 31.0, 37.0)   # rank r's value: distinct, not r or r + 1


def _as_number(x):
    if isinstance(x, torch.Tensor) and x.numel() == 1:
        return float(x.item())
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return float(x)
    return x


def diagnose_sum(got: float, value: float, values: list, rank: int) -> str:
    """What a wrong total usually means (the hint of `check_sum_over_ranks`)."""
    n, total = len(values), sum(values)
    if got == value:
        return (f"rank {rank} returned its own value: the values must travel. Put it in a tensor and call "
                f"dist.all_reduce on that tensor, then return the tensor's value")
    if abs(got - total / n) < 1e-9:
        return "that is the mean: dist.all_reduce sums by default (ReduceOp.SUM), do not divide by world_size"
    if got in (sum(range(n)), sum(range(1, n + 1))):
        return "that is the sum of the ranks (or rank + 1), not of the values each rank was given"
    if got == max(values):
        return "that is the largest value: use the default op, a sum, not ReduceOp.MAX"
    if abs(got - n * value) < 1e-9:
        return f"that is world_size x rank {rank}'s own value: every rank must contribute its own value"
    return "each rank puts its own `value` in, and every rank gets the same total out"


def check_sum_over_ranks(fn, world_size: int = 4, timeout: float = 30) -> str:
    """Run `fn(value)` on `world_size` real processes, rank r getting VALUES[r], and check
    that every rank returns the sum of all of them (a float or a one-element tensor).
    Returns the success line; raises AssertionError naming the rank and what its answer
    usually means, or when fn hangs (deadline) or raises."""
    with Checks("check_sum_over_ranks") as check:
        check.rule(callable(fn), f"fn={fn!r}: need a function fn(value)")
        check.integer("world_size", world_size, min=1, max=len(VALUES))
    values = list(VALUES[:world_size])
    got = run_on_ranks(fn, world_size, what=getattr(fn, "__name__", "fn"), timeout=timeout,
                       per_rank_args=[(v,) for v in values])
    total = sum(values)
    for rank, g in enumerate(got):
        g = _as_number(g)
        if not isinstance(g, float):
            raise AssertionError(f"rank {rank} returned {g!r}: return the total, a number (t.item()) or a "
                                 f"one-element tensor")
        if abs(g - total) > 1e-6 * abs(total):
            raise AssertionError(f"rank {rank} (value {values[rank]:g}) returned {g:g}, expected the sum "
                                 f"{total:g}. {diagnose_sum(g, values[rank], values, rank)}")
    return passed("check_sum_over_ranks", f"every rank returned the sum {total:g} of {world_size} values")
