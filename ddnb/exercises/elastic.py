"""Checker for the elastic-training section of chapter 14: the learner writes the function
that gives rank r of M its share of the samples not yet read, after `consumed` samples of
the epoch were read by an earlier world of any size (`ddnb.elastic.sampler`); it runs on
real processes, and a wrong share is named with what it usually means (a padded or
dropped tail, already read samples read again, blocks instead of a stride).
Taught in `notebooks/15_elastic_training.ipynb`.
"""
from __future__ import annotations

from collections import Counter

import torch

from ddnb._checks import Checks
from ddnb.elastic.sampler import ElasticSampler, remaining_indices
from ddnb.exercises.core import compare, passed, run_on_ranks


def _run_share(fn, order: list[int], consumed: int):
    import torch.distributed as dist

    return fn(list(order), consumed, dist.get_rank(), dist.get_world_size())


def diagnose_share(shares: list, order: list[int], consumed: int) -> str:
    """What a wrong set of shares (one list per rank) usually means: the hint of
    `check_remaining_indices`."""
    m, rest = len(shares), order[consumed:]
    read, flat = set(order[:consumed]), [i for s in shares for i in s]
    counts = Counter(flat)
    if consumed and shares == [order[r::m][consumed // m:] for r in range(m)]:
        return ("this is each rank's own stride of the whole epoch, skipped by consumed / M: right only when "
                "no resize happened and M divides consumed; after a resize the old world's stride does not fit: "
                "split order[consumed:] among the M ranks")
    if read & set(flat):
        return (f"samples read before the resize come again (e.g. {sorted(read & set(flat))[0]}): the shares "
                f"split order[consumed:], not the whole order")
    if any(c > 1 for c in counts.values()):
        return ("a sample is in two shares: that is DistributedSampler's padding (repeat the first samples "
                "so every rank reads as many); here each is read exactly once, and the first R mod M ranks "
                "read one more")
    if len(flat) < len(rest):
        return (f"{len(rest) - len(flat)} remaining sample(s) are in no share: a dropped tail (drop_last)? "
                f"The first R mod M ranks read one sample more")
    if sorted(flat) == sorted(rest):
        return ("every remaining sample is read once, but not strided: with blocks a step of b samples per rank "
                "does not read a prefix of the remaining order, so `consumed` no longer says what was read; "
                "give rank r the samples rest[r], rest[r + M], rest[r + 2M], ...")
    return "the shares are not the remaining samples: rank r of M reads order[consumed:][r::M]"


def check_remaining_indices(fn, world_size: int = 3, num_items: int = 23, consumed=(0, 8, 20, 23),
                            timeout: float = 30) -> str:
    """Run `fn(order, consumed, rank, world_size) -> list[int]` on `world_size` real
    processes, for an epoch of `num_items` samples and each value in `consumed`, and
    compare every rank's list with order[consumed:][rank::world_size]: every unread sample
    exactly once, strided. Accepts `ddnb.elastic.sampler.remaining_indices`. Returns the
    success line; AssertionError with a hint at the first rank that differs."""
    with Checks("check_remaining_indices") as check:
        check.rule(callable(fn), f"fn={fn!r}: need a function fn(order, consumed, rank, world_size)")
        check.integer("world_size", world_size, min=1, max=8)
        if check.integer("num_items", num_items, min=1):
            check.rule(isinstance(consumed, (list, tuple)) and len(consumed) > 0 and
                       all(isinstance(c, int) and 0 <= c <= num_items for c in consumed),
                       f"consumed={consumed!r}: need a non-empty list of integers in 0..{num_items}")
    order = ElasticSampler(num_items, seed=1).order()
    for c in consumed:
        shares = run_on_ranks(_run_share, world_size, fn, order, c, what=getattr(fn, "__name__", "fn"),
                              timeout=timeout)
        for rank, got in enumerate(shares):
            if not isinstance(got, (list, tuple)) or not all(isinstance(i, int) for i in got):
                raise AssertionError(f"rank {rank} returned {type(got).__name__}: return a list of dataset indices")
        expected = [remaining_indices(order, c, r, world_size) for r in range(world_size)]
        if [list(s) for s in shares] != expected:
            hint = diagnose_share([list(s) for s in shares], order, c)
            for rank, got in enumerate(shares):
                compare(torch.tensor(list(got), dtype=torch.int64), torch.tensor(expected[rank], dtype=torch.int64),
                        rank=rank, name=f"share after consumed={c} of {num_items}", hint=hint)
    return passed("check_remaining_indices", f"{world_size} ranks read every unread sample once, strided, "
                                             f"after consumed = {list(consumed)} of {num_items}")
