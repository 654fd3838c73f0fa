"""Checker for the tensor-parallel chapter (10): the learner's column-parallel linear
(Megatron-LM, Shoeybi et al. 2019, Sec. 3: Y = X A^T with A split by output features), run
on real processes against the unsharded layer. Taught in `notebooks/10_tensor_parallelism.ipynb`.
"""
from __future__ import annotations

import torch

from ddnb._checks import Checks
from ddnb.exercises.core import compare, passed, run_on_ranks


def _full(seed: int = 0, batch: int = 3, d_in: int = 5, d_out: int = 6):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, d_in, generator=g, dtype=torch.float64)
    return x, torch.randn(d_out, d_in, generator=g, dtype=torch.float64), torch.randn(d_out, generator=g,
                                                                                      dtype=torch.float64)


def _run_column(fn, d_out: int):
    import torch.distributed as dist

    rank, t = dist.get_rank(), dist.get_world_size()
    x, w, b = _full(d_out=d_out)
    rows = torch.arange(d_out).tensor_split(t)[rank]
    return fn(x, w[rows].clone(), b[rows].clone())


def check_column_parallel(fn, world_size: int = 3, d_out: int = 6, timeout: float = 30) -> str:
    """`fn(x, weight_shard, bias_shard)` on each of `world_size` ranks: x (B, in) the same on
    every rank, weight_shard (out/t, in) and bias_shard (out/t,) this rank's rows of the
    full layer. It must return the full Y = x W^T + b, (B, out), on every rank."""
    with Checks("check_column_parallel") as check:
        check.rule(callable(fn), f"fn={fn!r}: need a function fn(x, weight_shard, bias_shard)")
        check.integer("world_size", world_size, min=1, max=8)
        check.integer("d_out", d_out, min=world_size)
    outs = run_on_ranks(_run_column, world_size, fn, d_out, what=getattr(fn, "__name__", "fn"), timeout=timeout)
    x, w, b = _full(d_out=d_out)
    want = x @ w.T + b                                           # (B, out)
    for rank, got in enumerate(outs):
        hint = ""
        rows = torch.arange(d_out).tensor_split(world_size)[rank]
        if isinstance(got, torch.Tensor) and got.shape == want[:, rows].shape and got.shape != want.shape:
            hint = (f"rank {rank} returned only its own columns {rows.tolist()}: all-gather every rank's slice "
                    f"(dist.all_gather) and concatenate them along the last dimension")
        elif isinstance(got, torch.Tensor) and got.shape == want.shape:
            if torch.allclose(got.sort(-1).values, want.sort(-1).values) and not torch.allclose(got, want):
                hint = "the right numbers in the wrong places: concatenate the slices in rank order"
            elif not torch.allclose(got, want):
                hint = ("column-parallel slices are concatenated, not summed (summing is the row-parallel "
                        "layer's all-reduce)")
        compare(got, want, rank=rank, name="Y = x W^T + b", hint=hint)
    return passed("check_column_parallel", f"every rank holds the full output on {world_size} processes")
