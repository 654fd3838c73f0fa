"""torch.distributed's collectives on small, readable buffers: what every rank holds
before and after each one. Used by `notebooks/03_collectives.ipynb` to draw a picture per
collective (`ddnb.viz.plot_buffers`), and by the tests as the reference semantics.

Rank r starts with elements 10·r + 1, 10·r + 2, ... (so every value says where it came
from); the root of rooted collectives is rank 0.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ddnb.compat import all_gather_single, reduce_scatter_single

COLLECTIVES = ("broadcast", "scatter", "gather", "reduce", "all_gather", "reduce_scatter",
               "all_reduce", "all_to_all")


def rank_data(rank: int, numel: int) -> torch.Tensor:
    return torch.arange(1, numel + 1, dtype=torch.float32) + 10 * rank


def run_collective(name: str, per_rank: int = 1) -> tuple[list | None, list | None]:
    """Run collective `name` on this rank; returns (before, after) as plain lists
    (None where a rank holds no buffer of interest, e.g. a non-root after gather).
    Call it on every rank at once. `per_rank` elements per rank and destination."""
    if name not in COLLECTIVES:
        raise ValueError(f"unknown collective {name!r}; known: {COLLECTIVES}")
    rank, n = dist.get_rank(), dist.get_world_size()
    if name == "broadcast":  # the root's buffer is copied to everyone
        x = rank_data(rank, per_rank)
        before = x.tolist()
        dist.broadcast(x, src=0)
        return before, x.tolist()
    if name == "scatter":  # the root's buffer is cut into n pieces, one per rank
        full = rank_data(0, n * per_rank)
        out = torch.zeros(per_rank)
        dist.scatter(out, list(full.chunk(n)) if rank == 0 else None, src=0)
        return (full.tolist() if rank == 0 else None), out.tolist()
    if name == "gather":  # everyone's buffer ends on the root, in rank order
        x = rank_data(rank, per_rank)
        bufs = [torch.zeros(per_rank) for _ in range(n)] if rank == 0 else None
        dist.gather(x, bufs, dst=0)
        return x.tolist(), (torch.cat(bufs).tolist() if rank == 0 else None)
    if name == "reduce":  # the element-wise sum of everyone's buffer ends on the root
        x = rank_data(rank, per_rank)
        before = x.tolist()
        dist.reduce(x, dst=0)
        return before, (x.tolist() if rank == 0 else None)
    if name == "all_gather":  # everyone gets everyone's buffer
        x = rank_data(rank, per_rank)
        out = torch.zeros(n * per_rank)
        all_gather_single(out, x)          # all_gather_into_tensor before torch 2.13
        return x.tolist(), out.tolist()
    if name == "reduce_scatter":  # the sum, cut into n pieces: rank r keeps piece r
        x = rank_data(rank, n * per_rank)
        out = torch.zeros(per_rank)
        reduce_scatter_single(out, x)      # reduce_scatter_tensor before torch 2.13
        return x.tolist(), out.tolist()
    if name == "all_reduce":  # everyone gets the sum
        x = rank_data(rank, per_rank)
        before = x.tolist()
        dist.all_reduce(x)
        return before, x.tolist()
    # all_to_all: piece j of rank i goes to rank j, as piece i (a transpose)
    x = rank_data(rank, n * per_rank)
    out = torch.zeros(n * per_rank)
    dist.all_to_all_single(out, x)
    return x.tolist(), out.tolist()
