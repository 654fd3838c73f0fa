"""Checker for the data-parallel chapter (06): the learner's DDP communication hook
(`ddp.register_comm_hook(state, hook)`: the hook gets a bucket of gradients and returns a
Future of the tensor DDP writes back), run under torch's DistributedDataParallel on real
processes against the mean of every rank's gradients. Taught in
`notebooks/06_data_parallelism.ipynb`.
"""
from __future__ import annotations

import torch

from ddnb._checks import Checks
from ddnb.exercises.core import compare, passed, run_on_ranks


def _batch(rank: int):
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(8, 6, generator=g), torch.randn(8, 2, generator=g)


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))


def _run_hook(hook):
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(_model(), bucket_cap_mb=0.0002)   # several buckets of a few hundred bytes
    model.register_comm_hook(None, hook)
    x, y = _batch(dist.get_rank())
    F.mse_loss(model(x), y).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def _local_grads(rank: int) -> torch.Tensor:
    import torch.nn.functional as F

    model = _model()
    x, y = _batch(rank)
    F.mse_loss(model(x), y).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def check_comm_hook(hook, world_size: int = 3, timeout: float = 30) -> str:
    """Run `hook(state, bucket)` as the communication hook of DDP on `world_size` real
    processes, each with its own batch; every parameter's gradient must end as the mean
    of the ranks' gradients, as with DDP's default hook."""
    with Checks("check_comm_hook") as check:
        check.rule(callable(hook), f"hook={hook!r}: need a function hook(state, bucket) returning a Future")
        check.integer("world_size", world_size, min=1, max=8)
    got = run_on_ranks(_run_hook, world_size, hook, what=getattr(hook, "__name__", "hook"), timeout=timeout)
    local = [_local_grads(r) for r in range(world_size)]
    mean = sum(local) / world_size
    for rank, g in enumerate(got):
        hint = ""
        if torch.allclose(g, mean * world_size):
            hint = "every gradient is the sum, not the mean: divide the bucket by the world size"
        elif torch.allclose(g, local[rank]):
            hint = f"rank {rank} kept its own gradient: the bucket was not all-reduced (or not waited for)"
        compare(g, mean, rank=rank, name="gradients after backward", hint=hint)
    return passed("check_comm_hook", f"gradients are the mean over {world_size} processes, in several buckets")
