"""Checkers for the collectives chapters (03, 05): the learner's all-reduce from isend /
irecv, run on real processes against the sum every rank should end with and against the
bytes a ring sends (Patarasuk & Yuan 2009): 2(N-1) chunks of S/N per rank. The library
collectives (dist.all_reduce, ddnb.collectives.ring_allreduce, ...) are refused on the
ranks while it runs: they give the same sum without the exercise
(`ddnb.exercises.guard`). Taught in `notebooks/05_allreduce.ipynb`.
"""
from __future__ import annotations

import torch

from ddnb._checks import Checks
from ddnb.exercises import worlds
from ddnb.exercises.core import compare, passed, run_on_ranks
from ddnb.exercises.guard import ship


def _rank_input(rank: int, numel: int) -> torch.Tensor:
    """(numel,) float64 with distinct values per rank and element: 100·(rank+1) + index."""
    return torch.arange(numel, dtype=torch.float64) + 100.0 * (rank + 1)


WHY = "build it from isend/irecv, that is the exercise"


def _run_allreduce(blob, numel: int):
    """On a rank: the learner's function (shipped) on this rank's input, every collective
    refused; (the tensor after it, the bytes this rank sent)."""
    import torch.distributed as dist

    from ddnb.exercises.guard import land, refuse_collectives

    x = _rank_input(dist.get_rank(), numel)
    with refuse_collectives(why=WHY) as wire:
        land(blob)(x)
    return x, wire.sent_bytes


def ring_bytes(numel: int, n: int, itemsize: int) -> tuple[int, int, int]:
    """(fewest, most) bytes one rank sends in a ring all-reduce of numel elements on n
    ranks, and the total over the ranks: 2(N-1) chunks of floor(numel/N)..ceil(numel/N)
    elements per rank, 2(N-1)·S in all (Patarasuk & Yuan 2009)."""
    steps = 2 * (n - 1)
    return steps * (numel // n) * itemsize, steps * -(-numel // n) * itemsize, steps * numel * itemsize


def diagnose_bytes(sent: list, numel: int, n: int, itemsize: int) -> str | None:
    """The message when the bytes each rank sent are not a ring's, else None."""
    lo, hi, total = ring_bytes(numel, n, itemsize)
    S = numel * itemsize
    ring = (f"a ring all-reduce of {numel} element(s) of {itemsize} bytes on {n} ranks sends 2(N-1) = {2 * (n - 1)} "
            f"chunks of {numel // n}..{-(-numel // n)} elements, {lo}..{hi} bytes per rank and {total} in all "
            f"(Patarasuk & Yuan 2009)")
    for rank, b in enumerate(sent):
        if not lo <= b <= hi:
            if b == 0:
                why = "it sent nothing through isend/send: the sum arrived some other way"
            elif n > 2 and b >= (n - 1) * S:
                why = (f"it sent the whole tensor ({S} bytes) {b // S} times: a gather to one rank and a send back "
                       f"is not a ring; each rank sends only chunks of about S/N to its right")
            elif b > hi:
                why = "it sent more than a ring does: does every step send one chunk, not the whole tensor?"
            else:
                why = "it sent less than a ring does: every rank sends one chunk in each of the 2(N-1) steps"
            return f"rank {rank} sent {b} bytes; {ring}: {why}"
    if sum(sent) != total:
        return f"the ranks sent {sum(sent)} bytes in all ({sent} per rank); {ring}"
    return None


def diagnose_allreduce(got: torch.Tensor, mine: torch.Tensor, total: torch.Tensor, rank: int, n: int) -> str:
    """What a wrong all-reduce result usually means (the hint of `check_allreduce`)."""
    if torch.equal(got, mine):
        return (f"rank {rank}'s tensor is unchanged: write the result into `tensor` in place "
                f"(tensor.copy_(...) or tensor[...] = ...); a new tensor is not seen by the caller")
    if torch.allclose(got, total / n):
        return "every element is the mean: the exercise asks for the sum (divide only for op='avg')"
    summed = [c for c in torch.arange(got.numel()).tensor_split(n) if c.numel() and torch.allclose(got[c], total[c])]
    if len(summed) == 1 and not torch.allclose(got, total):     # after a ring's reduce-scatter: chunk (rank+1) % N
        c = summed[0]
        return (f"rank {rank} holds the sum only in one chunk (elements {c[0].item()}..{c[-1].item()}): "
                f"did the all-gather phase run?")
    for k in range(2, n + 1):
        if torch.allclose(got, k * total):
            return f"every element is {k}x the sum: a chunk was added more than once"
    return "the partial sums are wrong: check which chunk each step sends and which it adds into"


def check_allreduce(fn, world_size: int | None = None, sizes=(1, 7, 12, 64), timeout: float = 30,
                    world_sizes=(3, 4)) -> str:
    """Run `fn(tensor)`, an in-place sum all-reduce of a 1-D float64 tensor (the default
    process group) built from isend / irecv, on real processes for each size in `sizes`
    (sizes not divisible by the world size included), on two world sizes: `world_sizes`,
    or `world_size` and a second one (3 for a power of two, else 4; `ddnb.exercises.worlds`).
    Compares every rank's whole tensor with the sum, then the bytes each rank sent with a
    ring's (`ring_bytes`): a gather-to-root all-reduce from isend / irecv sums right and
    is refused there, naming the rank. Refused (`ddnb.exercises.guard`): every
    torch.distributed collective (dist.all_reduce included: it is what the exercise
    builds) and ddnb's own all-reduces. Returns the success line; raises AssertionError
    with a hint at the first rank and element that differ, or when fn hangs (deadline),
    raises or calls a refused collective."""
    with Checks("check_allreduce") as check:
        check.rule(callable(fn), f"fn={fn!r}: need a function fn(tensor)")
        ns = worlds.world_sizes(check, world_size, world_sizes, min_world=1)
        check.rule(isinstance(sizes, (list, tuple)) and len(sizes) > 0, f"sizes={sizes!r}: need a non-empty list")
        check.positive_ints(**{f"sizes[{i}]": v for i, v in enumerate(sizes or ())})
    blob = ship(fn)
    for n in ns:
        for numel in sizes:
            results = run_on_ranks(_run_allreduce, n, blob, numel, what=getattr(fn, "__name__", "fn"),
                                   timeout=timeout)
            total = sum(_rank_input(r, numel) for r in range(n))
            for rank, (got, _) in enumerate(results):
                mine = _rank_input(rank, numel)
                hint = diagnose_allreduce(got, mine, total, rank, n) if not torch.allclose(got, total) else ""
                compare(got, total, rank=rank, name=f"{n}-rank all-reduce of {numel} element(s)", hint=hint)
            wrong = diagnose_bytes([b for _, b in results], numel, n, total.element_size())
            if wrong:
                raise AssertionError(f"{n}-rank all-reduce of {numel} element(s): the sum is right, but {wrong}")
    return passed("check_allreduce", f"every rank holds the sum on {worlds.in_words(ns)}, sizes {list(sizes)}, "
                                     f"sending a ring's 2(N-1)·S/N bytes per rank")
