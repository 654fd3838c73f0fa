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

import shutil
import time

from ddnb._checks import Checks

from ddnb.data_parallel.wrappers import STRATEGIES, make_wrapper


def check_args(strategy: str, steps: int, per_rank: int, lr: float, hidden: int = 128, layers: int = 1,
               dropout: float = 0.0, checkpoint_dir=None, checkpoint_every=None, keep: int = 2,
               where: str = "train_digits") -> None:
    """Bad arguments fail here, on every rank alike, before any collective: one ValueError
    naming each."""
    with Checks(where) as check:
        check.choice("strategy", strategy, STRATEGIES)
        check.positive_ints(steps=steps, per_rank=per_rank, hidden=hidden, layers=layers, keep=keep)
        check.number("lr", lr, positive=True)
        check.number("dropout", dropout, min=0, below=1, why=" (a probability)")
        check.integer("checkpoint_every", checkpoint_every, min=1, none=True, why=" (steps)")
        check.rule(checkpoint_every is None or checkpoint_dir is not None,
                   "checkpoint_every needs checkpoint_dir: a folder every rank can read and write")


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


def _barrier(strategy: str) -> None:
    import torch

    if strategy == "horovod":
        import horovod.torch as hvd

        hvd.allreduce(torch.zeros(1), name="ddnb.checkpoint.barrier")
    else:
        import torch.distributed as dist

        dist.barrier()


def train_digits(strategy: str = "ddp", steps: int = 10, per_rank: int = 32, lr: float = 0.05,
                 momentum: float = 0.9, hidden: int = 128, layers: int = 1, seed: int = 0, allreduce: str = "torch",
                 bucket_mb: float = 0.01, tracer=None, dropout: float = 0.0, checkpoint_dir=None,
                 checkpoint_every: int | None = None, resume: bool = True, keep: int = 2, callback=None,
                 **optimizer_kwargs) -> dict:
    """Train on every rank; returns {"params": flat parameters (this rank's replica),
    "losses": the mean over ranks of each step's loss, "accuracy": test accuracy,
    "step_time": median seconds a step, "time": seconds of all steps, "rank", "world_size",
    "resumed_from": the checkpoint's step or None, "checkpoint": the last one written or None}.
    The MLP has `layers` hidden layers of `hidden` units (more layers: more, smaller
    gradient tensors to all-reduce), and nn.Dropout(dropout) after each when dropout > 0
    (each rank draws its own masks from its generator, seeded by `seed` and the rank).

    Checkpoints (`checkpoint.py`): with `checkpoint_dir`, the run goes on from the newest
    complete checkpoint there (model, optimizer, step, each rank's sampler position and
    random generators, the losses so far), unless resume=False, which starts over and
    removes the folder's old checkpoints; every `checkpoint_every` steps it writes one
    (keeping the newest `keep`). A run killed half-way and called again with the same
    arguments ends with the same parameters and losses as one that was never stopped.
    `callback(step, loss)` runs on every rank after each step (step: the steps done).
    `optimizer_kwargs` go to hvd.DistributedOptimizer (strategy "horovod")."""
    import math
    import statistics

    import torch
    import torch.nn.functional as F

    from ddnb.data import digits
    from ddnb.data_parallel import ShardSampler, replicate
    from ddnb.data_parallel import checkpoint as ckpt
    from ddnb.models import accuracy, flat_params, mlp

    check_args(strategy, steps, per_rank, lr, hidden, layers, dropout, checkpoint_dir, checkpoint_every, keep)
    rank, n = _rank_and_size(strategy)
    settings = {"strategy": strategy, "per_rank": per_rank, "lr": lr, "momentum": momentum, "hidden": hidden,
                "layers": layers, "seed": seed, "dropout": dropout}
    shared = own = None
    if checkpoint_dir is not None:
        found = ckpt.latest_checkpoint(checkpoint_dir)
        if resume and found is not None:
            shared, own = ckpt.load_checkpoint(found, rank, n, settings)    # refused alike on every rank
            if shared["step"] > steps:
                raise ValueError(f"the checkpoint {found} is at step {shared['step']}, past steps={steps}")
        elif rank == 0:                                                 # starting over: no stale step-S later
            for _, old in ckpt.checkpoints(checkpoint_dir):
                shutil.rmtree(old, ignore_errors=True)
    train_set, test_set = digits(seed=0)
    model = mlp((64,) + (hidden,) * layers + (10,), seed=rank, dropout=dropout)   # each rank its own start
    if shared is not None:
        model.load_state_dict(shared["model"])
    sync = None
    if strategy == "horovod":
        from ddnb.data_parallel import horovod_optimizer

        opt = horovod_optimizer(model, torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum),
                                **optimizer_kwargs)        # broadcasts rank 0's parameters first
        wrapped = model
    else:
        replicate(model)                                     # rank 0's parameters everywhere
        wrapped, sync = make_wrapper(strategy, model, bucket_mb=bucket_mb if strategy == "bucketed" else None,
                                     allreduce=allreduce, tracer=tracer)
        opt = torch.optim.SGD(wrapped.parameters(), lr=lr, momentum=momentum)
    sampler = ShardSampler(train_set, num_replicas=n, rank=rank, seed=seed)
    per_epoch = len(sampler) // per_rank
    step, losses, saved = 0, [], None
    if shared is not None:
        opt.load_state_dict(shared["optimizer"])
        sampler.load_state_dict(own["sampler"])
        step, losses = shared["step"], list(own["losses"])
        ckpt.set_rng_state(own["rng"])                       # last: nothing above may draw from it
    else:
        ckpt.seed_rngs(seed * 65536 + rank)
    resumed_from = step if shared is not None else None
    model.train()
    times, idx = [], sampler.indices()
    loop_start = time.perf_counter()
    while step < steps:
        if sampler.start + per_rank > per_epoch * per_rank:  # the epoch's last full batch is used
            sampler.set_epoch(sampler.epoch + 1)
            idx = sampler.indices()
        b = idx[sampler.start:sampler.start + per_rank]
        start = time.perf_counter()
        opt.zero_grad()
        loss = F.cross_entropy(wrapped(train_set.x[b]), train_set.y[b])
        loss.backward()
        if sync is not None:
            sync()                                           # naive: one all-reduce per parameter
        opt.step()
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
        sampler.start += per_rank
        step += 1
        if checkpoint_every is not None and step % checkpoint_every == 0:
            saved = ckpt.save_checkpoint(
                checkpoint_dir, step, rank=rank, barrier=lambda: _barrier(strategy), keep=keep,
                shared={"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step, "world_size": n,
                        "settings": settings},
                own={"sampler": sampler.state_dict(), "rng": ckpt.rng_state(), "losses": list(losses)})
        if callback is not None:
            callback(step, losses[-1])
    loop_time = time.perf_counter() - loop_start
    if hasattr(wrapped, "remove_hooks"):
        wrapped.remove_hooks()
    model.eval()
    return {"params": flat_params(model), "losses": _mean_over_ranks(strategy, losses),
            "accuracy": accuracy(model, test_set), "step_time": statistics.median(times) if times else math.nan,
            "time": loop_time, "rank": rank, "world_size": n, "resumed_from": resumed_from,
            "checkpoint": None if saved is None else str(saved)}


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

    check_args("ddp", steps, per_rank, lr, hidden, layers, where="reference_digits")
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
