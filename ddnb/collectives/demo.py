"""torch.distributed's collectives on small, readable buffers: what every rank holds
before and after each one. Used by `notebooks/03_collectives.ipynb` to draw a picture per
collective (`ddnb.viz.plot_buffers`), and by the tests as the reference semantics.

Rank r starts with elements 10·r + 1, 10·r + 2, ... (so every value says where it came
from); the root of rooted collectives is rank 0. `on_first_ranks` runs one on the first k ranks
only (a group of its own), and `expected_buffers` is the same table computed in one
process, from the collectives' definitions (MPI standard 4.0, Ch. 6): what the
`ddnb.viz.widgets.collective_explorer.CollectiveExplorer` widget and the tests compare with.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ddnb.collectives.p2p import global_rank
from ddnb.compat import all_gather_single, reduce_scatter_single

COLLECTIVES = ("broadcast", "scatter", "gather", "reduce", "all_gather", "reduce_scatter",
               "all_reduce", "all_to_all")


def rank_data(rank: int, numel: int) -> torch.Tensor:
    return torch.arange(1, numel + 1, dtype=torch.float32) + 10 * rank


def run_collective(name: str, per_rank: int = 1, group=None) -> tuple[list | None, list | None]:
    """Run collective `name` on this rank; returns (before, after) as plain lists
    (None where a rank holds no buffer of interest, e.g. a non-root after gather).
    Call it on every rank of `group` (None: the world) at once. `per_rank` elements per
    rank and destination; ranks and the root (group rank 0) are those of `group`."""
    if name not in COLLECTIVES:
        raise ValueError(f"unknown collective {name!r}; known: {COLLECTIVES}")
    rank, n, root = dist.get_rank(group), dist.get_world_size(group), global_rank(group, 0)
    if name == "broadcast":  # the root's buffer is copied to everyone
        x = rank_data(rank, per_rank)
        before = x.tolist()
        dist.broadcast(x, src=root, group=group)
        return before, x.tolist()
    if name == "scatter":  # the root's buffer is cut into n pieces, one per rank
        full = rank_data(0, n * per_rank)
        out = torch.zeros(per_rank)
        dist.scatter(out, list(full.chunk(n)) if rank == 0 else None, src=root, group=group)
        return (full.tolist() if rank == 0 else None), out.tolist()
    if name == "gather":  # everyone's buffer ends on the root, in rank order
        x = rank_data(rank, per_rank)
        bufs = [torch.zeros(per_rank) for _ in range(n)] if rank == 0 else None
        dist.gather(x, bufs, dst=root, group=group)
        return x.tolist(), (torch.cat(bufs).tolist() if rank == 0 else None)
    if name == "reduce":  # the element-wise sum of everyone's buffer ends on the root
        x = rank_data(rank, per_rank)
        before = x.tolist()
        dist.reduce(x, dst=root, group=group)
        return before, (x.tolist() if rank == 0 else None)
    if name == "all_gather":  # everyone gets everyone's buffer
        x = rank_data(rank, per_rank)
        out = torch.zeros(n * per_rank)
        all_gather_single(out, x, group=group)        # all_gather_into_tensor before torch 2.13
        return x.tolist(), out.tolist()
    if name == "reduce_scatter":  # the sum, cut into n pieces: rank r keeps piece r
        x = rank_data(rank, n * per_rank)
        out = torch.zeros(per_rank)
        reduce_scatter_single(out, x, group=group)    # reduce_scatter_tensor before torch 2.13
        return x.tolist(), out.tolist()
    if name == "all_reduce":  # everyone gets the sum
        x = rank_data(rank, per_rank)
        before = x.tolist()
        dist.all_reduce(x, group=group)
        return before, x.tolist()
    # all_to_all: piece j of rank i goes to rank j, as piece i (a transpose)
    x = rank_data(rank, n * per_rank)
    out = torch.zeros(n * per_rank)
    dist.all_to_all_single(out, x, group=group)
    return x.tolist(), out.tolist()


def on_first_ranks(name: str, world_size: int, per_rank: int = 1) -> tuple[list | None, list | None] | None:
    """Run collective `name` on ranks 0 .. world_size - 1 only, in a group of their own;
    the other ranks return None. Call it on every rank of the world at once (every rank
    takes part in creating a group, `dist.new_group`); the group is destroyed after."""
    n = dist.get_world_size()
    if not (isinstance(world_size, int) and 1 <= world_size <= n):
        raise ValueError(f"world_size must be an int in 1..{n} (the ranks there are), got {world_size!r}")
    if name not in COLLECTIVES:                      # before new_group: every rank raises, none blocks
        raise ValueError(f"unknown collective {name!r}; known: {COLLECTIVES}")
    group = None if world_size == n else dist.new_group(list(range(world_size)))
    try:
        return run_collective(name, per_rank, group) if dist.get_rank() < world_size else None
    finally:
        if group is not None:
            dist.barrier()                           # everyone is done with the group before it goes
            dist.destroy_process_group(group)


def expected_buffers(name: str, world_size: int, per_rank: int = 1) -> tuple[list, list]:
    """(before, after), one entry per rank, as `run_collective` returns them, computed in
    one process from the definitions (root = rank 0, sum for the reductions)."""
    if name not in COLLECTIVES:
        raise ValueError(f"unknown collective {name!r}; known: {COLLECTIVES}")
    n, k = world_size, per_rank
    data = lambda r, m: rank_data(r, m).tolist()
    chunk = lambda row, i: row[i * k:(i + 1) * k]
    own = [data(r, k) for r in range(n)]                         # n buffers of k
    total = torch.stack([rank_data(r, k) for r in range(n)]).sum(0).tolist()
    long = [data(r, n * k) for r in range(n)]                    # n buffers of n·k
    long_sum = torch.stack([rank_data(r, n * k) for r in range(n)]).sum(0).tolist()
    if name == "broadcast":
        return own, [own[0]] * n
    if name == "scatter":
        return [data(0, n * k)] + [None] * (n - 1), [chunk(data(0, n * k), r) for r in range(n)]
    if name == "gather":
        return own, [sum(own, [])] + [None] * (n - 1)
    if name == "reduce":
        return own, [total] + [None] * (n - 1)
    if name == "all_gather":
        return own, [sum(own, [])] * n
    if name == "reduce_scatter":
        return long, [chunk(long_sum, r) for r in range(n)]
    if name == "all_reduce":
        return own, [total] * n
    return long, [sum((chunk(long[i], j) for i in range(n)), []) for j in range(n)]   # all_to_all
