"""One constructor for the data-parallel strategies, so every harness (the chapter's
training, the demo, the benchmark) wraps a model the same way:

    model, sync = make_wrapper("bucketed", model, bucket_mb=5)
    loss.backward(); sync(); optimizer.step()

    "naive"     NaiveDataParallel: one all-reduce per parameter, in sync() after backward
    "bucketed"  BucketedDataParallel: buckets all-reduced from autograd hooks (as DDP)
    "ddp"       torch's DistributedDataParallel (Li et al. 2020, "PyTorch Distributed:
                Experiences on Accelerating Data Parallel Training", VLDB 13(12))
    "horovod"   the model as is: Horovod averages in its optimizer (`horovod_optimizer`,
                Sergeev & Del Balso 2018), which the caller builds

DDP's buckets go through the one traced layer's communication hook
(`ddnb.collectives.traced.ddp_comm_hook`): None in real mode (DDP's own all-reduce), the
emulator's in an emulated cluster. This module never asks which. Taught in
`notebooks/06_data_parallelism.ipynb`.
"""
from __future__ import annotations

STRATEGIES = ("naive", "bucketed", "ddp", "horovod")


def make_wrapper(strategy: str, model, group=None, bucket_mb: float | None = None, allreduce: str = "torch",
                 tracer=None, **options):
    """(wrapped, sync): `model` wrapped for `strategy` and sync(), what to call after
    backward (the naive wrapper's all-reduces; nothing for the others). bucket_mb: the
    bucket size of "bucketed" and "ddp" (None: each one's default, 25 MB; DDP's default
    also makes its first bucket 1 MB, an explicit size does not). `options` go to the
    wrapper's constructor (e.g. record_grad_norms for "bucketed")."""
    from ddnb._checks import Checks

    with Checks("make_wrapper") as check:
        check.choice("strategy", strategy, STRATEGIES)
    none = lambda: None  # noqa: E731
    if strategy == "naive":
        from ddnb.data_parallel.naive import NaiveDataParallel

        wrapped = NaiveDataParallel(model, group=group, allreduce=allreduce, tracer=tracer, **options)
        return wrapped, wrapped.sync_gradients
    if strategy == "bucketed":
        from ddnb.data_parallel.bucketed import BucketedDataParallel

        if bucket_mb is not None:
            options["bucket_mb"] = bucket_mb
        return BucketedDataParallel(model, group=group, allreduce=allreduce, tracer=tracer, **options), none
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        from ddnb.collectives import traced
        from ddnb.emulate.compute import uncounted

        with uncounted():                   # its broadcast of the parameters is set-up, not a step
            wrapped = DistributedDataParallel(model, process_group=group, bucket_cap_mb=bucket_mb, **options)
        hook = traced.ddp_comm_hook()
        if hook is not None:
            wrapped.register_comm_hook(group, hook)
        return wrapped, none
    return model, none
