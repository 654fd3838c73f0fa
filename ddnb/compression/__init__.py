"""Fewer bytes per step: gradient compression as DDP communication hooks, one method per
module, the plain all-reduce first (Vogels et al. 2019 and the papers each module cites):

    half.py         allreduce_hook, fp16_hook, bf16_hook   4, then 2 bytes per element
    powersgd.py     PowerSGDState, powersgd_hook           rank-r factors P, Q; error feedback
    topk.py         TopKState, topk_hook                   k (index, value) pairs, all-gathered
    sign.py         SignState, sign_hook                   1 bit per element + a scale per tensor
    comm.py         Bucket, allreduce, allgather           what the hooks share; every message traced
    accumulation.py accumulate                             k micro-batches, one all-reduce (no_sync)
    precision.py    bf16 autocast, bf16 weights + fp32 master weights, memory per rank
    loss_scaling.py DynamicLossScaler, train_fp16            fp16 + fp32 master weights, skip on overflow

Every hook has DDP's signature, `hook(state, bucket) -> Future`, and runs on torch's
DistributedDataParallel and on ddnb's BucketedDataParallel alike:

    state, hook = make_hook("powersgd", rank=4, start=10, tracer=tracer)
    ddp.register_comm_hook(state, hook)         # or bucketed.register_comm_hook(state, hook)

Bytes per step are measured from the trace (`comm.bytes_per_step`) and equal each method's
formula (`method_bytes`). Measured end to end by `python -m ddnb.bench compress`
(`ddnb/bench/compress.py`); taught in `notebooks/14_precision_compression.ipynb`.
"""
from __future__ import annotations

import math

from ddnb._checks import Checks
from ddnb.compression.half import HookState, allreduce_hook, bf16_hook, fp16_hook
from ddnb.compression.powersgd import PowerSGDState, powersgd_bytes, powersgd_hook
from ddnb.compression.sign import SignState, sign_bytes, sign_hook
from ddnb.compression.topk import TopKState, topk_bytes, topk_hook

METHODS = ("none", "fp16", "bf16", "powersgd", "topk", "sign")


def make_hook(method: str, group=None, tracer=None, rank: int = 4, start: int = 2, ratio: float = 0.01,
              error_feedback: bool = True, seed: int = 0, **powersgd_kwargs):
    """(state, hook) for `method`, one of METHODS: "none" (traced all-reduce), "fp16",
    "bf16", "powersgd" (rank `rank`, plain all-reduce for the first `start` steps, seed
    `seed`), "topk" (`ratio` of each bucket) or "sign". An unknown method, or a bad
    setting of the chosen one, raises one ValueError before anything is sent."""
    with Checks("make_hook") as check:
        check.choice("method", method, METHODS)
    if method in ("none", "fp16", "bf16"):
        return HookState(group, tracer), {"none": allreduce_hook, "fp16": fp16_hook, "bf16": bf16_hook}[method]
    if method == "powersgd":
        return PowerSGDState(group, matrix_approximation_rank=rank, start_powerSGD_iter=start,
                             use_error_feedback=error_feedback, random_seed=seed, tracer=tracer,
                             **powersgd_kwargs), powersgd_hook
    if method == "topk":
        return TopKState(group, ratio=ratio, use_error_feedback=error_feedback, tracer=tracer), topk_hook
    return SignState(group, use_error_feedback=error_feedback, tracer=tracer), sign_hook


def method_bytes(method: str, buckets, rank: int = 4, ratio: float = 0.01, min_compression_rate: float = 2) -> int:
    """The formula: bytes one rank hands to the collectives in one (compressed) step, for
    `buckets`, a list of buckets, each a list of its gradient shapes (fp32 gradients)."""
    with Checks("method_bytes") as check:
        check.choice("method", method, METHODS)
    numels = [[math.prod(s) for s in b] for b in buckets]
    if method == "none":
        return sum(4 * sum(b) for b in numels)
    if method in ("fp16", "bf16"):
        return sum(2 * sum(b) for b in numels)
    if method == "powersgd":
        return sum(powersgd_bytes(b, rank, min_compression_rate) for b in buckets)
    if method == "topk":
        return sum(topk_bytes(max(1, math.ceil(ratio * sum(b)))) for b in numels)
    return sum(sign_bytes(b) for b in numels)


__all__ = ["METHODS", "HookState", "PowerSGDState", "SignState", "TopKState", "allreduce_hook", "bf16_hook",
           "fp16_hook", "make_hook", "method_bytes", "powersgd_bytes", "powersgd_hook", "sign_bytes", "sign_hook",
           "topk_bytes", "topk_hook"]
