"""Gradient accumulation: k micro-batches, one synchronization (Li et al., "PyTorch
Distributed", VLDB 2020, Sec. 3.2.4, `no_sync`; Goyal et al. 2017 for why the large batch
is the same step).

The loss of a batch of k·B samples is the mean of k micro-batch means, so

    ∇ (1/k) Σ_j L_j = (1/k) Σ_j ∇ L_j

and k backward passes of loss_j / k, accumulated in `.grad`, give the gradient of the
k-times larger batch. Only the last one needs to be averaged over the ranks: the first
k-1 run inside `model.no_sync()` (torch DDP, ddnb's BucketedDataParallel) and send
nothing. So a step on k·B samples per rank costs one all-reduce per bucket instead of k:
communication per sample falls k-fold, and activations are held for one micro-batch of B
at a time, which is the point when k·B samples do not fit. Taught in `notebooks/14_precision_compression.ipynb`.

    loss = accumulate(ddp, loss_fn, [(x0, y0), (x1, y1), (x2, y2), (x3, y3)])
    optimizer.step()
"""
from __future__ import annotations

import contextlib


def accumulate(model, loss_fn, micro_batches) -> float:
    """Forward and backward each (x, y) of `micro_batches` with loss_fn(model(x), y) / k,
    all but the last inside `model.no_sync()`: after it, every `.grad` holds the mean over
    the ranks of the k-micro-batch gradient. Returns the (summed) loss, a float."""
    micro_batches = list(micro_batches)
    k, total = len(micro_batches), 0.0
    if k == 0:
        raise ValueError("accumulate: no micro-batches")
    for j, (x, y) in enumerate(micro_batches):
        with model.no_sync() if j < k - 1 else contextlib.nullcontext():   # the last one synchronizes
            loss = loss_fn(model(x), y) / k
            loss.backward()
        total += loss.item()
    return total


def accumulation_calls(samples: int, per_rank: int, k: int, buckets: int) -> int:
    """All-reduce calls to train on `samples` samples per rank in micro-batches of
    `per_rank`, synchronizing every k of them, with `buckets` buckets: buckets ·
    samples / (per_rank · k)."""
    if samples % (per_rank * k):
        raise ValueError(f"samples={samples} is not a multiple of per_rank·k = {per_rank * k}")
    return buckets * samples // (per_rank * k)
