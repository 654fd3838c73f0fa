"""Chapter 06's first data-parallel run, as a library function: the digits MLP
Linear(64, 128) -> ReLU -> Linear(128, 10) trained for a few SGD + momentum steps on every
rank, each on its own shard, with one of the synchronizations of this package, traced.

    results = cluster.run(train_dp, "bucketed")       # one (params, events, norms, names) per rank
    reference = reference_digits(workers=4, steps=10)["params"]   # one process, the global batch

Strategies: "naive" (`NaiveDataParallel`, one all-reduce per parameter after backward),
"bucketed" (`BucketedDataParallel`, buckets from autograd hooks during backward, with its
per-parameter gradient norms recorded) and "ddp" (torch DistributedDataParallel). The same
training as `train.py`'s `train_digits` with its default settings (so the reference is
`reference_digits`), without its checkpoints, and returning the trace. Taught in
`notebooks/06_data_parallelism.ipynb`.
"""
from __future__ import annotations

from ddnb._checks import Checks

from ddnb.data_parallel.wrappers import STRATEGIES as _ALL

STRATEGIES = _ALL[:3]   # on torch.distributed: the ones this demo traces


def train_dp(strategy: str, steps: int = 10, per_rank: int = 32, lr: float = 0.05, allreduce: str = "torch",
             bucket_mb: float = 0.01, seed: int = 0) -> tuple:
    """Run on every rank of an initialized torch.distributed world. Returns (this rank's
    flat parameters after training, its trace events (`ddnb.trace`), the bucketed wrapper's
    `grad_norm_history` or None, the parameter names or None)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from ddnb.data import digits
    from ddnb.data_parallel import ShardSampler, replicate
    from ddnb.data_parallel.wrappers import make_wrapper
    from ddnb.data_parallel.naive import validate_allreduce
    from ddnb.models import flat_params, mlp
    from ddnb.trace import Tracer

    with Checks("train_dp") as check:
        check.choice("strategy", strategy, STRATEGIES)
        check.positive_ints(steps=steps, per_rank=per_rank)
        check.number("lr", lr, positive=True)
        check.number("bucket_mb", bucket_mb, positive=True, why=" (megabytes)")
        validate_allreduce(allreduce, check)
    rank, n = dist.get_rank(), dist.get_world_size()
    train_set, _ = digits(seed=0)
    idx = ShardSampler(train_set, num_replicas=n, rank=rank, seed=seed).indices()
    if steps * per_rank > len(idx):                              # the same on every rank: all raise
        raise ValueError(f"train_dp: steps * per_rank = {steps * per_rank} digits, more than one epoch of a "
                         f"rank's shard ({len(idx)} on {n} ranks); this demo does not reshuffle")
    model = replicate(mlp((64, 128, 10), seed=rank))            # rank 0's parameters everywhere
    tracer = Tracer()
    dp, sync = make_wrapper(strategy, model, bucket_mb=bucket_mb if strategy == "bucketed" else None,
                            allreduce=allreduce, tracer=tracer,
                            **({"record_grad_norms": True} if strategy == "bucketed" else {}))
    opt = torch.optim.SGD(dp.parameters(), lr=lr, momentum=0.9)
    for t in range(steps):
        b = idx[t * per_rank:(t + 1) * per_rank]                # this rank's digits, (per_rank,)
        opt.zero_grad()
        F.cross_entropy(dp(train_set.x[b]), train_set.y[b]).backward()
        sync()                                                    # naive: one all-reduce per parameter
        opt.step()
    if hasattr(dp, "remove_hooks"):
        dp.remove_hooks()
    return flat_params(model), tracer.take(), getattr(dp, "grad_norm_history", None), getattr(dp, "names", None)
