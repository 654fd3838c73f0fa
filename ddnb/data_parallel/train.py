"""One data-parallel training run on the digits, the same code for every strategy and every
launcher: a `ddnb.Cluster` (the notebooks), `torchrun` and `horovodrun` (`python -m
ddnb.launch dp`), or a `ddnb.testing.World` (the tests).

    out = train_digits("ddp", steps=10)          # on every rank of an initialized world
    ref = reference_digits(workers=4, steps=10)  # one process, the global batch each step
    (out["params"] - ref["params"]).abs().max()  # < 1e-5: data parallelism is global-batch SGD

Each rank builds the MLP from a seed of its own (so replication is really needed), trains
on its shard of `ShardSampler` (reshuffled each epoch from a shared seed), `per_rank`
digits a step, with SGD + momentum. Strategies: "naive" (`NaiveDataParallel`), "bucketed"
(`BucketedDataParallel`), "ddp" (torch DistributedDataParallel) on torch.distributed, and
"horovod" (`hvd.DistributedOptimizer`, Sergeev & Del Balso 2018) on Horovod alone.
Taught in `notebooks/06_data_parallelism.ipynb` and `notebooks/07_horovod.ipynb`.
"""
from __future__ import annotations

import time

STRATEGIES = ("naive", "bucketed", "ddp", "horovod")


def check_args(strategy: str, steps: int, per_rank: int, lr: float, hidden: int = 128, layers: int = 1) -> None:
    """Bad arguments fail here, on every rank alike, before any collective."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r} is not one of {STRATEGIES}")
    for name, v in (("steps", steps), ("per_rank", per_rank), ("hidden", hidden), ("layers", layers)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr!r}")


def _rank_and_size(strategy: str) -> tuple[int, int]:
    if strategy == "horovod":
        import horovod.torch as hvd

        if not hvd.is_initialized():
            raise ValueError("strategy='horovod' needs Horovod initialized (ddnb.Cluster(horovod=True), "
                             "or run under horovodrun)")
        return hvd.rank(), hvd.size()
    import torch.distributed as dist

    if not dist.is_initialized():
        raise ValueError(f"strategy={strategy!r} needs torch.distributed initialized (a ddnb.Cluster, or torchrun)")
    return dist.get_rank(), dist.get_world_size()


def _mean_over_ranks(strategy: str, values):
    import torch

    t = torch.tensor(values, dtype=torch.float64)
    if strategy == "horovod":
        import horovod.torch as hvd

        return hvd.allreduce(t, op=hvd.Average, name="losses").tolist()
    import torch.distributed as dist

    dist.all_reduce(t)
    return (t / dist.get_world_size()).tolist()


def train_digits(strategy: str = "ddp", steps: int = 10, per_rank: int = 32, lr: float = 0.05,
                 momentum: float = 0.9, hidden: int = 128, layers: int = 1, seed: int = 0, allreduce: str = "torch",
                 bucket_mb: float = 0.01, tracer=None, **optimizer_kwargs) -> dict:
    """Train on every rank; returns {"params": flat parameters (this rank's replica),
    "losses": the mean over ranks of each step's loss, "accuracy": test accuracy,
    "step_time": median seconds a step, "time": seconds of all steps, "rank", "world_size"}.
    The MLP has `layers` hidden layers of `hidden` units (more layers: more, smaller
    gradient tensors to all-reduce).
    `optimizer_kwargs` go to hvd.DistributedOptimizer (strategy "horovod")."""
    import statistics

    import torch
    import torch.nn.functional as F

    from ddnb.data import digits
    from ddnb.data_parallel import BucketedDataParallel, NaiveDataParallel, ShardSampler, replicate
    from ddnb.models import accuracy, flat_params, mlp

    check_args(strategy, steps, per_rank, lr, hidden, layers)
    rank, n = _rank_and_size(strategy)
    train_set, test_set = digits(seed=0)
    model = mlp((64,) + (hidden,) * layers + (10,), seed=rank)   # each rank its own start: replication needed
    sync = None
    if strategy == "horovod":
        from ddnb.data_parallel import horovod_optimizer

        opt = horovod_optimizer(model, torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum),
                                **optimizer_kwargs)        # broadcasts rank 0's parameters first
        wrapped = model
    else:
        from torch.nn.parallel import DistributedDataParallel

        replicate(model)                                     # rank 0's parameters everywhere
        if strategy == "naive":
            wrapped = NaiveDataParallel(model, allreduce=allreduce, tracer=tracer)
            sync = wrapped.sync_gradients
        elif strategy == "bucketed":
            wrapped = BucketedDataParallel(model, bucket_mb=bucket_mb, allreduce=allreduce, tracer=tracer)
        else:
            wrapped = DistributedDataParallel(model)
        opt = torch.optim.SGD(wrapped.parameters(), lr=lr, momentum=momentum)
    sampler = ShardSampler(train_set, num_replicas=n, rank=rank, seed=seed)
    per_epoch = len(sampler) // per_rank
    losses, times, idx = [], [], None
    loop_start = time.perf_counter()
    for t in range(steps):
        epoch, i = divmod(t, per_epoch)
        if i == 0:
            sampler.set_epoch(epoch)
            idx = sampler.indices()
        b = idx[i * per_rank:(i + 1) * per_rank]
        start = time.perf_counter()
        opt.zero_grad()
        loss = F.cross_entropy(wrapped(train_set.x[b]), train_set.y[b])
        loss.backward()
        if sync is not None:
            sync()                                           # naive: one all-reduce per parameter
        opt.step()
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    loop_time = time.perf_counter() - loop_start
    if hasattr(wrapped, "remove_hooks"):
        wrapped.remove_hooks()
    return {"params": flat_params(model), "losses": _mean_over_ranks(strategy, losses),
            "accuracy": accuracy(model, test_set), "step_time": statistics.median(times), "time": loop_time,
            "rank": rank, "world_size": n}


def reference_digits(workers: int, steps: int = 10, per_rank: int = 32, lr: float = 0.05,
                     momentum: float = 0.9, hidden: int = 128, layers: int = 1, seed: int = 0) -> dict:
    """One process doing what `train_digits` does on `workers` ranks: SGD on the global
    batch (the concatenation of every rank's `per_rank` digits) from rank 0's start.
    Returns {"params", "losses", "accuracy"} (losses: the mean of the shards' losses)."""
    import torch
    import torch.nn.functional as F

    from ddnb.data import digits
    from ddnb.data_parallel import shard_indices
    from ddnb.models import accuracy, flat_params, mlp

    check_args("ddp", steps, per_rank, lr, hidden, layers)
    train_set, test_set = digits(seed=0)
    model = mlp((64,) + (hidden,) * layers + (10,), seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    shards, losses = None, []
    per_epoch = len(shard_indices(len(train_set), workers, 0, seed=seed)) // per_rank
    for t in range(steps):
        epoch, i = divmod(t, per_epoch)
        if i == 0:
            shards = [shard_indices(len(train_set), workers, r, epoch=epoch, seed=seed) for r in range(workers)]
        parts = [s[i * per_rank:(i + 1) * per_rank] for s in shards]
        opt.zero_grad()
        logits = model(train_set.x[[j for p in parts for j in p]])
        loss = F.cross_entropy(logits, train_set.y[[j for p in parts for j in p]])
        loss.backward()
        opt.step()
        with torch.no_grad():   # what the ranks report: the mean of their shards' losses
            chunks = logits.split(per_rank)
            losses.append(sum(F.cross_entropy(c, train_set.y[p]).item() for c, p in zip(chunks, parts)) / workers)
    return {"params": flat_params(model), "losses": losses, "accuracy": accuracy(model, test_set)}
