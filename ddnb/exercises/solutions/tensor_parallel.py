"""Solution of `ddnb.exercises.tensor_parallel` (`notebooks/10_tensor_parallelism.ipynb`)."""
from __future__ import annotations

import torch
import torch.distributed as dist


def column_parallel_linear(x: torch.Tensor, weight_shard: torch.Tensor, bias_shard: torch.Tensor) -> torch.Tensor:
    """Y_r = x W_r^T + b_r on each rank (B, out/t), then all-gather: Y = [Y_0, ..., Y_{t-1}]."""
    local = x @ weight_shard.T + bias_shard                       # (B, out/t)
    parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, local.contiguous())
    return torch.cat(parts, dim=-1)                               # (B, out)
