"""Horovod's own gradient compression in `python -m ddnb.bench compress`: the rows
"horovod:none" (hvd.Compression.none) and "horovod:fp16" (hvd.Compression.fp16).

The same digits MLP (64 → 256 → 256 → 10, `ddnb.compression.train.HIDDEN`), seed, batches
and SGD with momentum as the DDP rows (`train_compressed`), but trained with
`hvd.DistributedOptimizer(..., compression=...)` (`ddnb.data_parallel.horovod`) in a world
of its own (`ddnb.testing.World(n, horovod=True)`, as the all-reduce bench runs Horovod).
Compression.fp16 casts each fp32 gradient to fp16 before Horovod's all-reduce and back
after it (Sergeev & Del Balso 2018, Sec. 6 mentions fp16 allreduce; horovod/torch/
compression.py), so the formula is that of ddnb's fp16 hook: 2 bytes per element.

Measured: the bytes of every tensor DistributedOptimizer hands to Horovod's all-reduce
(`allreduce_async_` / `grouped_allreduce_async_`, counted by wrapping them while the
method trains), per step: the same quantity as the DDP rows' trace ("bytes one rank hands
to the collectives"), checked against `method_bytes`. Not measured: what Gloo then puts
on the wire; Horovod fuses the tensors into one buffer (Tensor Fusion) and ring-all-reduces
it, 2(N-1)/N times the bytes handed per rank (`ddnb.cost.alpha_beta`).
Horovod is optional: without `horovod.torch` these rows are skipped with a message.
Taught in `notebooks/14_precision_compression.ipynb`.
"""
from __future__ import annotations

import sys

HOROVOD_METHODS = {"horovod:none": "none", "horovod:fp16": "fp16"}   # row -> the ddnb method with its formula


def is_horovod(text: str) -> bool:
    return text in HOROVOD_METHODS


def rank_horovod_compress(methods, steps: int, per_rank: int, lr: float, seed: int) -> list:
    """On every rank of a Horovod world: train once per method; (name, result) as
    `rank_compress` returns them (bytes per step counted at Horovod's all-reduce)."""
    import statistics
    import time

    import horovod.torch as hvd
    import horovod.torch.optimizer as hvd_optimizer
    import torch
    import torch.nn.functional as F

    from ddnb.compression.train import HIDDEN
    from ddnb.data import batch_indices, digits
    from ddnb.data_parallel.horovod import horovod_optimizer
    from ddnb.models import accuracy, mlp

    rank, n = hvd.rank(), hvd.size()
    train_set, test_set = digits(seed=0)
    out = []
    for text in methods:
        counted: dict = {}
        step = [0]
        originals = hvd_optimizer.allreduce_async_, hvd_optimizer.grouped_allreduce_async_

        def one(tensor, *a, **kw):
            counted[step[0]] = counted.get(step[0], 0) + tensor.numel() * tensor.element_size()
            return originals[0](tensor, *a, **kw)

        def grouped(tensors, *a, **kw):
            counted[step[0]] = counted.get(step[0], 0) + sum(t.numel() * t.element_size() for t in tensors)
            return originals[1](tensors, *a, **kw)

        model = mlp((64,) + tuple(HIDDEN) + (10,), seed=seed)
        compression = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16}[HOROVOD_METHODS[text]]
        opt = horovod_optimizer(model, torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
                                compression=compression)
        hvd_optimizer.allreduce_async_, hvd_optimizer.grouped_allreduce_async_ = one, grouped
        losses, times = [], []
        try:
            for t in range(steps):
                step[0] = t
                idx = batch_indices(len(train_set), n * per_rank, t, seed)[rank * per_rank:(rank + 1) * per_rank]
                start = time.perf_counter()
                opt.zero_grad()
                loss = F.cross_entropy(model(train_set.x[idx]), train_set.y[idx])
                loss.backward()
                opt.step()
                times.append(time.perf_counter() - start)
                losses.append(loss.item())                      # this rank's, as train_compressed reports
        finally:
            hvd_optimizer.allreduce_async_, hvd_optimizer.grouped_allreduce_async_ = originals
        step_time = hvd.allreduce(torch.tensor([statistics.median(times)]), op=hvd.Max, name=f"time.{text}").item()
        out.append((text, {"bytes": counted, "losses": losses, "accuracy": accuracy(model, test_set),
                           "step_time": step_time, "shapes": [tuple(p.shape) for p in model.parameters()]}))
    return out


def horovod_results(workers: int, methods, steps: int, per_rank: int, lr: float, seed: int,
                    timeout: float) -> list:
    """The Horovod rows' results from a Horovod world of `workers`, or [] (and a line on
    stderr) when Horovod with PyTorch is not importable."""
    from ddnb.runtime.horovod import horovod_available
    from ddnb.testing import World

    if not methods:
        return []
    if not horovod_available():
        print(f"compress: {', '.join(methods)} skipped: Horovod with PyTorch is not importable here "
              f"(`import horovod.torch` failed; `make lab` builds it)", file=sys.stderr, flush=True)
        return []
    with World(workers, timeout=timeout, horovod=True) as world:
        return world.run(rank_horovod_compress, list(methods), steps, per_rank, lr, seed)[0]
