"""One data-parallel training run of the digits MLP with a communication hook, the same
for every method, on torch's DDP or ddnb's BucketedDataParallel, with gradient
accumulation: what the tests, the bench (`python -m ddnb.bench compress`) and the
notebook compare.

    out = train_compressed("powersgd", steps=100, rank=4)   # on every rank of a world
    out["accuracy"], out["bytes"]                           # test accuracy, bytes per step

Every rank builds the same MLP from `seed`; step t's global batch is `batch_indices(...,
N·per_rank·accumulate, t, seed)` of the digits, rank r taking its contiguous slice, split
into `accumulate` micro-batches of `per_rank`. SGD with momentum. The model and batches
live on `device` (default `ddnb.collectives.devices.rank_device()`: the rank's GPU when its
group has nccl, else the CPU); the parameters come back on the host. Taught in
`notebooks/14_precision_compression.ipynb`.
"""
from __future__ import annotations

import statistics

from ddnb._checks import Checks

WRAPPERS = ("ddp", "bucketed")
HIDDEN = (256, 256)     # 64 -> 256 -> 256 -> 10: 85,002 parameters, three matrices PowerSGD compresses


def train_compressed(method: str | None = "none", wrapper: str = "ddp", steps: int = 50, per_rank: int = 32,
                     accumulate: int = 1, hidden=HIDDEN, lr: float = 0.05, momentum: float = 0.9, seed: int = 0,
                     hook=None, bucket_mb: float = 25.0, device=None, **method_kwargs) -> dict:
    """Train on every rank; returns {"params": flat parameters, "losses": this rank's
    losses (each the mean over its global batch slice), "accuracy": test accuracy,
    "bytes": {step: bytes handed to the collectives}, "calls": {step: collective calls},
    "step_time": median seconds a step, "device": where it trained}. `method`: a
    ddnb.compression method (see `make_hook`, whose settings `method_kwargs` go to), or
    None for the wrapper's own all-reduce; `hook(group, tracer) -> (state, hook)` instead:
    any hook (torch's). `device`: see the module's docstring."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from ddnb.collectives.devices import rank_device
    from ddnb.compression import make_hook
    from ddnb.compression.accumulation import accumulate as accumulate_grads
    from ddnb.compression.comm import bytes_per_step
    from ddnb.data import Dataset, batch_indices, digits
    from ddnb.data_parallel import BucketedDataParallel
    from ddnb.emulate import uncounted
    from ddnb.models import accuracy, flat_params, mlp
    from ddnb.timing import barrier_and_clock
    from ddnb.trace import Tracer

    with Checks("train_compressed") as check:
        check.choice("wrapper", wrapper, WRAPPERS)
        check.positive_ints(steps=steps, per_rank=per_rank, accumulate=accumulate)
    rank, n = dist.get_rank(), dist.get_world_size()
    device = rank_device() if device is None else torch.device(device)
    train_set, test_set = (Dataset(d.x.to(device), d.y.to(device)) for d in digits(seed=0))
    model = mlp((64,) + tuple(hidden) + (10,), seed=seed).to(device)
    tracer = Tracer()
    state_hook = hook(None, tracer) if hook is not None else (
        None if method is None else make_hook(method, tracer=tracer, **method_kwargs))
    if wrapper == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        with uncounted():           # set-up: its broadcast of the parameters is not a step
            wrapped = DistributedDataParallel(model, bucket_cap_mb=bucket_mb)
    else:
        wrapped = BucketedDataParallel(model, bucket_mb=bucket_mb, tracer=Tracer())
    if state_hook is not None:
        wrapped.register_comm_hook(*state_hook)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    local = per_rank * accumulate
    losses, times, clock = [], [], barrier_and_clock()[1]      # emulated seconds in an emulated cluster
    for t in range(steps):
        idx = batch_indices(len(train_set), n * local, t, seed)[rank * local:(rank + 1) * local]   # (local,)
        idx = idx.to(device)
        start = clock()
        opt.zero_grad()
        total = accumulate_grads(wrapped, F.cross_entropy, [(train_set.x[mb], train_set.y[mb])
                                                            for mb in idx.split(per_rank)])
        opt.step()
        times.append(clock() - start)
        losses.append(total)
    if hasattr(wrapped, "remove_hooks"):
        wrapped.remove_hooks()
    events = tracer.take()
    calls: dict[int, int] = {}
    for e in events:
        if e["kind"] == "collective" and "step" in e:
            calls[e["step"]] = calls.get(e["step"], 0) + 1
    return {"params": flat_params(model).cpu(), "losses": losses, "accuracy": accuracy(model, test_set),
            "bytes": bytes_per_step(events), "calls": calls, "step_time": statistics.median(times),
            "shapes": [tuple(p.shape) for p in model.parameters()], "device": str(device)}
