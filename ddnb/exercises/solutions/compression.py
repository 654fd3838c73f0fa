"""Solutions of `ddnb.exercises.compression` (`notebooks/14_precision_compression.ipynb`)."""
from __future__ import annotations

import torch
import torch.distributed as dist


def topk_error_feedback(grad, error, k):
    """Top-k with error feedback: send the k largest |grad + error|, keep the rest."""
    a = grad + error
    idx = a.abs().topk(k).indices                          # (k,)
    n = dist.get_world_size()
    all_idx = [torch.empty_like(idx) for _ in range(n)]
    all_val = [torch.empty(k) for _ in range(n)]
    dist.all_gather(all_idx, idx)
    dist.all_gather(all_val, a[idx].contiguous())
    mean = torch.zeros_like(a)
    for i, v in zip(all_idx, all_val):
        mean.index_add_(0, i, v)
    new_error = a.clone()
    new_error[idx] = 0
    return mean / n, new_error


powersgd_bytes_512x256_rank4 = 4 * (512 + 256) * 4    # P (512, 4) + Q (256, 4), 4 bytes each: 12,288
accumulation_calls_192_8_4 = 192 // (8 * 4)           # one all-reduce per k micro-batches: 6
