"""Torch DDP's gradient buckets as its reducer really builds them, measured: the buckets a
communication hook is handed in each step (`GradBucket.index()`, `GradBucket.buffer()`).

DDP cannot know before its first backward in which order the gradients will be ready, so
(without find_unused_parameters) its first step puts every gradient in one bucket; it then
rebuilds the buckets in the order the gradients arrived, closing the first once it holds at
least 1 MiB (`torch.distributed._DEFAULT_FIRST_BUCKET_BYTES`) and every other once it holds
`bucket_cap_mb` (25 MiB by default) (Li et al., "PyTorch Distributed: Experiences on
Accelerating Data Parallel Training", VLDB 2020, Sec. 3.2.3; torch's
`_compute_bucket_assignment_by_size`). `ddnb.cost.dp_step.ddp_buckets` is the model of that
rule; `ddp_bucket_bytes` counts what DDP does. Taught in `notebooks/12_scalability.ipynb`:

    seen = cluster.run(ddp_bucket_bytes, partial(bench_model, "few_large", width=1024, layers=3),
                       torch.randn(4, 1024))
    seen[0]      # rank 0: [[12595200], [4198400, 8396800]]: one bucket, then two
"""
from __future__ import annotations

from ddnb._checks import Checks


def ddp_bucket_bytes(make_model, inputs, steps: int = 2, bucket_cap_mb: float | None = None,
                     group=None) -> list[list[int]]:
    """Run on every rank of `group`: wrap make_model() in torch DistributedDataParallel (its
    defaults, or `bucket_cap_mb`), run `steps` forward + backward passes on `inputs` (loss:
    the mean of the output's squares), and return, per step, the bytes of each bucket DDP
    all-reduced, in bucket index order (numel x element_size of `bucket.buffer()`, as a comm
    hook sees it; the hook then runs torch's own `allreduce_hook`, so the gradients are DDP's)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel

    with Checks("ddp_bucket_bytes") as check:
        check.rule(callable(make_model), f"make_model={make_model!r}: need a function that returns an nn.Module")
        check.rule(torch.is_tensor(inputs), f"inputs={type(inputs).__name__}: need a tensor, the model's input batch")
        check.integer("steps", steps, min=1)
        check.number("bucket_cap_mb", bucket_cap_mb, positive=True, none=True, why=" (MiB)")
    kwargs = {} if bucket_cap_mb is None else {"bucket_cap_mb": bucket_cap_mb}
    model = DistributedDataParallel(make_model(), process_group=group, **kwargs)
    seen: list[dict] = []

    def counting_hook(process_group, bucket):   # no annotations: DDP checks them
        buf = bucket.buffer()                                          # (numel,) the bucket's gradients
        seen[-1][bucket.index()] = buf.numel() * buf.element_size()
        return allreduce_hook(process_group, bucket)

    model.register_comm_hook(group if group is not None else dist.group.WORLD, counting_hook)
    for _ in range(steps):
        seen.append({})
        model.zero_grad()
        model(inputs).square().mean().backward()                       # the hook fires once per bucket
    return [[step[i] for i in sorted(step)] for step in seen]
