"""Checker for the partition of layers into pipeline stages by measured time (08): the linear
partition problem, contiguous stages minimizing the slowest one (PipeDream, Narayanan et al.
2019, Sec. 3.1). Compared with the optimum found by trying every split.
Taught in `notebooks/08_model_parallelism.ipynb`.

    check_partition(my_partition, times=times)    # my_partition(times, stages) -> [(begin, end), ...]
"""
from __future__ import annotations

import itertools
import random

from ddnb._checks import Checks
from ddnb.exercises.core import passed

SHORTCUTS = ("balanced_partition", "partition_layers")   # the library's answer to this exercise


def optimum(times, stages: int) -> float:
    """The smallest possible slowest stage, by trying every set of stages - 1 split points."""
    n = len(times)
    best = float("inf")
    for cuts in itertools.combinations(range(1, n), stages - 1):
        edges = (0, *cuts, n)
        best = min(best, max(sum(times[a:b]) for a, b in zip(edges, edges[1:])))
    return best


def _cases(times):
    rng = random.Random(0)
    cases = [([1.0] * 6, 3), ([5.0, 1, 1, 1, 1, 1], 2), ([1.0, 1, 1, 1, 1, 5], 3), ([0.1, 4, 4, 4, 4, 0.3], 4)]
    cases += [([rng.uniform(0.1, 3) for _ in range(rng.randint(4, 9))], rng.randint(2, 4)) for _ in range(12)]
    if times is not None:
        cases += [(list(times), s) for s in range(2, min(len(times), 4) + 1)]
    return cases


def check_partition(fn, times=None) -> str:
    """Call `fn(times, stages)` on fixed and random per-layer times (and on `times`, the
    chapter's measured ones, when given): it must return `stages` contiguous, non-empty
    (begin, end) ranges covering 0..len(times) whose slowest stage equals the optimum."""
    with Checks("check_partition") as check:
        check.rule(callable(fn), f"fn={fn!r}: need a function fn(times, stages) returning [(begin, end), ...]")
    used = [n for n in SHORTCUTS if n in getattr(getattr(fn, "__code__", None), "co_names", ())]
    if used:
        raise AssertionError(f"{fn.__name__} calls {used[0]}, the library's partitioner: write the search yourself "
                             f"(try the split points, or dynamic programming over them), that is the exercise")
    for times_, stages in _cases(times):
        got = fn(list(times_), stages)
        n = len(times_)
        where = f"times {[round(t, 3) for t in times_]}, {stages} stages"
        ok = isinstance(got, (list, tuple)) and len(got) == stages and all(len(r) == 2 for r in got)
        if not ok:
            raise AssertionError(f"{where}: got {got!r}; return a list of {stages} (begin, end) pairs")
        edges = [got[0][0]] + [e for _, e in got]
        if got[0][0] != 0 or got[-1][1] != n or any(a[1] != b[0] for a, b in zip(got, got[1:])) or \
                any(b <= a for a, b in got):
            raise AssertionError(f"{where}: {list(got)} must be contiguous, non-empty and cover 0..{n} "
                                 f"(stage k ends where stage k + 1 begins)")
        slowest, best = max(sum(times_[a:b]) for a, b in got), optimum(times_, stages)
        if slowest > best * (1 + 1e-9):
            raise AssertionError(f"{where}: your slowest stage takes {slowest:.4g}, the best split's {best:.4g} "
                                 f"(edges {edges}): a greedy cut is not enough, compare every split")
    return passed("check_partition", f"optimal on {len(_cases(times))} cases"
                                     f"{', the measured times included' if times is not None else ''}")
