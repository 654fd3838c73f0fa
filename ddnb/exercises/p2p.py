"""Checkers for the point-to-point chapter (03): a ring pass and a broadcast built from
isend / irecv, run on real processes. A ring pass whose sends all block before any
receive is posted waits in a circle (MPI-4.0, Sec. 3.5: such a program is "unsafe");
the checker's large tensor makes that deadlock happen, and names it. Both are the
exercise, so the library's collectives (dist.broadcast, ddnb.collectives.broadcast, ...)
are refused on the ranks while the learner's function runs, and the bytes sent are
counted (`ddnb.exercises.guard`): S per rank for the pass, (N-1)·S in all for the
broadcast. Taught in `notebooks/03_collectives.ipynb`.

    check_ring_shift(ring_shift, world_size=4)       # ring_shift(tensor) -> left neighbour's tensor
    check_broadcast(broadcast, world_size=4)         # broadcast(tensor, root), in place
"""
from __future__ import annotations

import torch

from ddnb._checks import Checks, is_int
from ddnb.exercises import worlds
from ddnb.exercises.core import compare, passed, run_on_ranks
from ddnb.exercises.guard import ship

LARGE = 1 << 22   # elements: 16 MB of float32, beyond what gloo sends without a posted receive


def _rank_input(rank: int, numel: int) -> torch.Tensor:
    """(numel,) float32, distinct per rank and element: 1000·(rank+1) + index (exact up to 2^24)."""
    return torch.arange(numel, dtype=torch.float32) + 1000.0 * (rank + 1)


WHY_SHIFT = "send with isend (or send) and receive with irecv (or recv), that is the exercise"
WHY_BROADCAST = "send the root's tensor with isend/send and receive it with irecv/recv, that is the exercise"


def _run_shift(blob, numel: int):
    """On a rank: the learner's ring pass, collectives refused; compared here, whole, with
    the left neighbour's tensor (a 16 MB result need not travel back). Returns
    (None or (type, shape), first mismatch or None, pattern, bytes sent, messages per peer)."""
    import torch.distributed as dist

    from ddnb.exercises.guard import land, refuse_collectives

    rank, n = dist.get_rank(), dist.get_world_size()
    x = _rank_input(rank, numel)
    with refuse_collectives(why=WHY_SHIFT) as wire:
        out = land(blob)(x)
    expected = _rank_input((rank - 1) % n, numel)
    if not isinstance(out, torch.Tensor) or out.shape != expected.shape:
        bad = (type(out).__name__, tuple(out.shape) if isinstance(out, torch.Tensor) else None)
        return bad, None, "", wire.sent_bytes, wire.messages
    miss = None
    if not torch.equal(out, expected):                # exact: a value off by one element is wrong
        i = int((out != expected).nonzero()[0])
        miss = i, out[i].item(), expected[i].item()
    pattern = "" if miss is None else diagnose_shift(out, rank, n, numel)
    return None, miss, pattern, wire.sent_bytes, wire.messages


def diagnose_shift(got: torch.Tensor, rank: int, n: int, numel: int) -> str:
    """What a wrong ring pass usually means (the hint of `check_ring_shift`), from the whole tensor."""
    if torch.equal(got, _rank_input(rank, numel)):
        return (f"rank {rank} returned its own tensor: return the buffer the message from the left arrived in, "
                f"not the one it sent")
    if n > 2 and torch.equal(got, _rank_input((rank + 1) % n, numel)):
        return (f"rank {rank} holds rank {(rank + 1) % n}'s values: it received from its right; in a pass to the "
                f"right every rank receives from its left, (rank - 1) % world_size")
    if not bool(got.any()):
        return f"rank {rank}'s buffer is all zeros: wait() on the receive before returning it"
    return "every rank sends its tensor to (rank + 1) % world_size and receives from (rank - 1) % world_size"


def check_ring_shift(fn, world_size: int | None = None, sizes=(1, 5, LARGE), timeout: float = 30,
                     world_sizes=(4, 3)) -> str:
    """Run `fn(tensor)` on real processes: every rank sends its 1-D tensor to its right,
    (rank + 1) % N, and returns the tensor that arrived from its left, compared whole on
    the rank. Two world sizes run: `world_sizes`, or `world_size` and a second one
    (`ddnb.exercises.worlds`). The last size is large enough that blocking sends posted
    before any receive deadlock (reported at the deadline, naming the ranks). Each rank
    must send exactly its tensor's bytes, S, and every torch.distributed collective and
    ddnb's own are refused (`ddnb.exercises.guard`): the pass is the exercise. Returns
    the success line, else AssertionError with the rank, the element and a hint."""
    with Checks("check_ring_shift") as check:
        check.rule(callable(fn), f"fn={fn!r}: need a function fn(tensor)")
        ns = worlds.world_sizes(check, world_size, world_sizes, min_world=2)
        check.rule(isinstance(sizes, (list, tuple)) and len(sizes) > 0, f"sizes={sizes!r}: need a non-empty list")
        check.positive_ints(**{f"sizes[{i}]": v for i, v in enumerate(sizes or ())})
    blob = ship(fn)
    for n in ns:
        for numel in sizes:
            got = run_on_ranks(_run_shift, n, blob, numel, what=getattr(fn, "__name__", "fn"), timeout=timeout)
            name = f"{n}-rank ring pass of {numel} element(s)"
            for rank, (bad, miss, pattern, _, _) in enumerate(got):
                if bad is not None:
                    raise AssertionError(f"{name}: rank {rank} returned {bad[0]}"
                                         + (f" of shape {bad[1]}" if bad[1] is not None else "")
                                         + f": return the tensor received from the left, shape ({numel},)")
                if miss is not None:
                    i, g, e = miss
                    raise AssertionError(f"{name} on rank {rank}, element {i}: expected {e:g}, got {g:g}. {pattern}")
            S = numel * 4
            for rank, (_, _, _, sent, messages) in enumerate(got):
                if sent != S:
                    raise AssertionError(f"{name}: the values are right, but rank {rank} sent {sent} bytes "
                                         f"({dict(messages)} messages per destination); a ring pass sends its "
                                         f"tensor once, {S} bytes, to (rank + 1) % world_size")
    return passed("check_ring_shift", f"every rank holds its left neighbour's whole tensor on {worlds.in_words(ns)}, "
                                      f"sizes {list(sizes)}, S bytes sent per rank, no deadlock")


def _run_broadcast(blob, numel: int, root: int):
    import torch.distributed as dist

    from ddnb.exercises.guard import land, refuse_collectives

    x = _rank_input(dist.get_rank(), numel)
    with refuse_collectives(why=WHY_BROADCAST) as wire:
        land(blob)(x, root)
    return x, wire.sent_bytes


def diagnose_broadcast(got: torch.Tensor, rank: int, root: int, numel: int, all_from_0: bool = False) -> str:
    """What a wrong broadcast usually means (the hint of `check_broadcast`); all_from_0:
    every rank ended with rank 0's values."""
    if root != 0 and all_from_0:
        return f"every rank holds rank 0's values: broadcast from `root` ({root}), not from rank 0"
    if rank == root:
        return f"the root's (rank {root}) tensor changed: the root only sends"
    if torch.equal(got, _rank_input(rank, numel)):
        return (f"rank {rank} still holds its own values: every rank but the root receives once, from the root, "
                f"into `tensor` (in place)")
    return f"rank {rank} should hold the root's (rank {root}) values"


def check_broadcast(fn, world_size: int | None = None, roots=None, sizes=(1, 6), timeout: float = 30,
                    world_sizes=(4, 3)) -> str:
    """Run `fn(tensor, root)` on real processes for each root and size: after it every
    rank's 1-D tensor holds the root's values, in place. Two world sizes run:
    `world_sizes`, or `world_size` and a second one (`ddnb.exercises.worlds`); roots: 0
    and N // 2 of each (or `roots`, ranks of the smallest). The ranks together must send
    (N-1)·S bytes point to point, what a linear or a tree broadcast sends; every
    torch.distributed collective (dist.broadcast included) and ddnb's own are refused
    (`ddnb.exercises.guard`). Returns the success line, else AssertionError with the
    rank, the element and a hint."""
    with Checks("check_broadcast") as check:
        check.rule(callable(fn), f"fn={fn!r}: need a function fn(tensor, root)")
        ns = worlds.world_sizes(check, world_size, world_sizes, min_world=1)
        if ns and roots is not None:
            check.rule(isinstance(roots, (list, tuple)) and all(is_int(r) and 0 <= r < min(ns) for r in roots),
                       f"roots={roots!r}: need ranks in 0..{min(ns) - 1}")
        check.rule(isinstance(sizes, (list, tuple)) and len(sizes) > 0, f"sizes={sizes!r}: need a non-empty list")
        check.positive_ints(**{f"sizes[{i}]": v for i, v in enumerate(sizes or ())})
    blob = ship(fn)
    for n in ns:
        for root in (sorted({0, n // 2}) if roots is None else roots):
            for numel in sizes:
                got = run_on_ranks(_run_broadcast, n, blob, numel, root, what=getattr(fn, "__name__", "fn"),
                                   timeout=timeout)
                name = f"{n}-rank broadcast of {numel} element(s) from root {root}"
                expected = _rank_input(root, numel)
                all_from_0 = all(torch.equal(g, _rank_input(0, numel)) for g, _ in got)
                for rank, (g, _) in enumerate(got):
                    hint = "" if torch.equal(g, expected) else diagnose_broadcast(g, rank, root, numel, all_from_0)
                    compare(g, expected, rank=rank, name=name, hint=hint)
                sent, S = [b for _, b in got], numel * 4
                if sum(sent) != (n - 1) * S:
                    raise AssertionError(
                        f"{name}: the values are right, but the ranks sent {sum(sent)} bytes in all ({sent} per "
                        f"rank); a broadcast from point-to-point messages, linear or a tree, delivers the root's "
                        f"{S} bytes once to each of the N-1 others: (N-1)·S = {(n - 1) * S}")
    return passed("check_broadcast", f"every rank holds the root's tensor on {worlds.in_words(ns)}, roots "
                                     f"{'0 and N // 2' if roots is None else list(roots)}, sizes {list(sizes)}, "
                                     f"(N-1)·S bytes sent")
