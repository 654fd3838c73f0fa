"""torch.distributed names that moved between the torch versions ddnb supports (>= 2.1).

torch 2.13 calls the flat-tensor collectives `all_gather_single` and `reduce_scatter_single`;
torch 2.1-2.12 call them `all_gather_into_tensor` and `reduce_scatter_tensor` (same
arguments: output, input, op, group, async_op). ddnb calls them through here, so that the
code written against the CPU build pinned for CI (2.13) also runs on the CUDA build a GPU
machine has (found on an H200 with torch 2.11: ZeRO stopped at `reduce_scatter_single`).
Used by `notebooks/03_collectives.ipynb` (the collectives demo) and `notebooks/11_memory_sharding.ipynb` (ZeRO).
"""
from __future__ import annotations

import torch.distributed as dist


def all_gather_single(output, input, group=None, async_op: bool = False):
    """output (N·S,) <- every rank's input (S,), in rank order."""
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(output, input, group=group, async_op=async_op)


def reduce_scatter_single(output, input, op=dist.ReduceOp.SUM, group=None, async_op: bool = False):
    """output (S,) <- slice r of the element-wise reduction of every rank's input (N·S,)."""
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return fn(output, input, op=op, group=group, async_op=async_op)
