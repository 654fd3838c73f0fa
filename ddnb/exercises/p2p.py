"""Checkers for the point-to-point chapter (03): a ring pass and a broadcast built from
isend / irecv, run on real processes. A ring pass whose sends all block before any
receive is posted waits in a circle (MPI-4.0, Sec. 3.5: such a program is "unsafe");
the checker's large tensor makes that deadlock happen, and names it.
Taught in `notebooks/03_collectives.ipynb`.

    check_ring_shift(ring_shift, world_size=4)       # ring_shift(tensor) -> left neighbour's tensor
    check_broadcast(broadcast, world_size=4)         # broadcast(tensor, root), in place
"""
from __future__ import annotations

import torch

from ddnb._checks import Checks
from ddnb.exercises.core import check_sized_call, compare, passed, run_on_ranks

LARGE = 1 << 22   # elements: 16 MB of float32, beyond what gloo sends without a posted receive


def _rank_input(rank: int, numel: int) -> torch.Tensor:
    """(numel,) float32, distinct per rank and element: 1000·(rank+1) + index (exact up to 2^24)."""
    return torch.arange(numel, dtype=torch.float32) + 1000.0 * (rank + 1)


def _run_shift(fn, numel: int):
    import torch.distributed as dist

    x = _rank_input(dist.get_rank(), numel)
    out = fn(x)
    return out[:64].clone() if isinstance(out, torch.Tensor) else out     # (<=64,): enough to diagnose


def diagnose_shift(got: torch.Tensor, rank: int, n: int, numel: int) -> str:
    """What a wrong ring pass usually means (the hint of `check_ring_shift`)."""
    k = got.numel()
    if torch.equal(got, _rank_input(rank, numel)[:k]):
        return (f"rank {rank} returned its own tensor: return the buffer the message from the left arrived in, "
                f"not the one it sent")
    if n > 2 and torch.equal(got, _rank_input((rank + 1) % n, numel)[:k]):
        return (f"rank {rank} holds rank {(rank + 1) % n}'s values: it received from its right; in a pass to the "
                f"right every rank receives from its left, (rank - 1) % world_size")
    if not bool(got.any()):
        return f"rank {rank}'s buffer is all zeros: wait() on the receive before returning it"
    return "every rank sends its tensor to (rank + 1) % world_size and receives from (rank - 1) % world_size"


def check_ring_shift(fn, world_size: int = 4, sizes=(1, 5, LARGE), timeout: float = 30) -> str:
    """Run `fn(tensor)` on `world_size` real processes: every rank sends its 1-D tensor to
    its right, (rank + 1) % N, and returns the tensor that arrived from its left. The last
    size is large enough that blocking sends posted before any receive deadlock (reported
    at the deadline, naming the ranks). Returns the success line, else AssertionError with
    the rank, the element and a hint."""
    check_sized_call("check_ring_shift", fn, world_size, sizes, min_world=2)
    for numel in sizes:
        got = run_on_ranks(_run_shift, world_size, fn, numel, what=getattr(fn, "__name__", "fn"), timeout=timeout)
        for rank, g in enumerate(got):
            if not isinstance(g, torch.Tensor):
                raise AssertionError(f"rank {rank} returned {type(g).__name__}: return the tensor received from "
                                     f"the left")
            expected = _rank_input((rank - 1) % world_size, numel)[:64]
            if g.shape == expected.shape and not torch.equal(g, expected):
                compare(g, expected, rank=rank, name=f"ring pass of {numel} element(s)",
                        hint=diagnose_shift(g, rank, world_size, numel))
            compare(g, expected, rank=rank, name=f"ring pass of {numel} element(s)")
    return passed("check_ring_shift", f"every rank holds its left neighbour's tensor on {world_size} processes, "
                                      f"sizes {list(sizes)}, no deadlock")


def _run_broadcast(fn, numel: int, root: int):
    import torch.distributed as dist

    x = _rank_input(dist.get_rank(), numel)
    fn(x, root)
    return x


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


def check_broadcast(fn, world_size: int = 4, roots=(0, 2), sizes=(1, 6), timeout: float = 30) -> str:
    """Run `fn(tensor, root)` on `world_size` real processes for each root and size: after
    it every rank's 1-D tensor holds the root's values, in place. Returns the success line,
    else AssertionError with the rank, the element and a hint."""
    with Checks("check_broadcast") as check:
        check.rule(callable(fn), f"fn={fn!r}: need a function fn(tensor, root)")
        if check.integer("world_size", world_size, min=1, max=8):
            check.rule(all(isinstance(r, int) and 0 <= r < world_size for r in roots),
                       f"roots={roots!r}: need ranks in 0..{world_size - 1}")
        check.positive_ints(**{f"sizes[{i}]": v for i, v in enumerate(sizes or ())})
    for root in roots:
        for numel in sizes:
            got = run_on_ranks(_run_broadcast, world_size, fn, numel, root, what=getattr(fn, "__name__", "fn"),
                               timeout=timeout)
            expected = _rank_input(root, numel)
            all_from_0 = all(torch.equal(g, _rank_input(0, numel)) for g in got)
            for rank, g in enumerate(got):
                hint = "" if torch.equal(g, expected) else diagnose_broadcast(g, rank, root, numel, all_from_0)
                compare(g, expected, rank=rank, name=f"broadcast of {numel} element(s) from root {root}", hint=hint)
    return passed("check_broadcast", f"every rank holds the root's tensor on {world_size} processes, roots "
                                     f"{list(roots)}, sizes {list(sizes)}")
