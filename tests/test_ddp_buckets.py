"""ddnb.data_parallel.ddp_buckets: torch DDP's buckets counted by a comm hook on real
processes: one bucket in the first step, then the buckets DDP rebuilt in the order the
gradients arrived (first closed at 1 MiB, the others at bucket_cap_mb), which is what
ddnb.cost.dp_step.ddp_buckets models; bad arguments named before DDP is built."""
from functools import partial

import pytest
import torch

from ddnb.bench.dp import bench_model
from ddnb.cost.dp_step import ddp_buckets
from ddnb.data_parallel.ddp_buckets import ddp_bucket_bytes

MIB = 1 << 20
FEW_LARGE = partial(bench_model, "few_large", width=1024, layers=3)      # 6 tensors, 12,595,200 bytes


def test_one_bucket_first_then_the_rebuilt_ones_that_the_model_predicts(world):
    seen = world(2).run(ddp_bucket_bytes, FEW_LARGE, torch.randn(4, 1024), 3)
    assert seen[0] == seen[1]                                       # every rank the same buckets
    first, second, third = seen[0]
    total = 3 * (1024 * 1024 + 1024) * 4
    assert first == [total]                                         # order unknown yet: one bucket
    assert second == third == [4 * MIB + 4096, 2 * (4 * MIB + 4096)]   # last layer alone, then the rest
    sizes = [p.numel() * 4 for p in FEW_LARGE().parameters()]
    model = ddp_buckets(sizes, [torch.float32] * len(sizes), 25 * MIB, MIB)
    assert [sum(sizes[i] for i in b) for b in model] == second


def test_a_smaller_cap_gives_more_buckets(world):
    seen = world(2).run(ddp_bucket_bytes, FEW_LARGE, torch.randn(2, 1024), 2, 4)   # bucket_cap_mb=4
    rebuilt = seen[0][1]
    assert len(rebuilt) == 3 and sum(rebuilt) == 3 * (4 * MIB + 4096)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r"ddp_bucket_bytes: make_model=3: need a function.*inputs=list: need a "
                                         r"tensor.*steps=0: need an integer >= 1.*bucket_cap_mb=-1"):
        ddp_bucket_bytes(3, [1.0], steps=0, bucket_cap_mb=-1)
