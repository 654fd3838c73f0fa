"""Gradient accumulation with no_sync (ddnb.compression.accumulation), on torch's DDP and
ddnb's BucketedDataParallel: k micro-steps equal one step on a k-times larger batch
within 1e-6, and the all-reduce calls and bytes (traced) fall k-fold."""
import math

import pytest

from ddnb.compression.accumulation import accumulate, accumulation_calls
from ddnb.compression.train import train_compressed

K, STEPS, B = 4, 3, 8


def _compare(wrapper):
    big = train_compressed("none", wrapper=wrapper, steps=STEPS, per_rank=K * B)             # one batch of K·B
    acc = train_compressed("none", wrapper=wrapper, steps=STEPS, per_rank=B, accumulate=K)   # K micro-batches of B
    small = train_compressed("none", wrapper=wrapper, steps=K * STEPS, per_rank=B)           # same samples, no accumulation
    return ((acc["params"] - big["params"]).abs().max().item(), [acc[k] for k in ("calls", "bytes")],
            [small[k] for k in ("calls", "bytes")], acc["shapes"])


@pytest.mark.parametrize("wrapper", ["ddp", "bucketed"])
def test_accumulation_equals_the_large_batch_and_communicates_k_times_less(world, wrapper):
    for err, (acc_calls, acc_bytes), (small_calls, small_bytes), shapes in world(2).run(_compare, wrapper):
        assert err < 1e-6
        numel = sum(math.prod(s) for s in shapes)
        assert acc_calls == {t: 1 for t in range(STEPS)}                  # one bucket, one all-reduce a step
        assert sum(small_calls.values()) == K * sum(acc_calls.values()) == accumulation_calls(
            STEPS * K * B, B, 1, buckets=1)
        assert sum(acc_calls.values()) == accumulation_calls(STEPS * K * B, B, K, buckets=1)
        assert sum(small_bytes.values()) == K * sum(acc_bytes.values()) == K * STEPS * 4 * numel


def test_bad_input():
    with pytest.raises(ValueError, match="no micro-batches"):
        accumulate(None, None, [])
    with pytest.raises(ValueError, match="samples=10 is not a multiple of per_rank·k = 8"):
        accumulation_calls(10, 2, 4, 1)
    with pytest.raises(ValueError, match="accumulate=0: need an integer >= 1"):
        train_compressed(accumulate=0)
