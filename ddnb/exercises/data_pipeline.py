"""Checkers of `notebooks/01b_data_pipeline.ipynb`: cut an epoch's shards among ranks
(implement, run on real processes), predict the read bandwidth a node needs, and predict
which stage bounds a pipeline.

    check_rank_spans(my_rank_spans)                  # fn(shard_sizes, world_size, rank) -> [(shard, begin, end)]
    check_read_bandwidth(my_bandwidth, global_batch=4096, step_s=0.5, bytes_per_sample=110e3, nodes=64)
    check_bound(my_bound, workers=4, shard_samples=1000, decode_s=3e-3, step_s=0.2)

The reference answers are `ddnb.data_pipeline.sharding.rank_spans` (shuffle=False) and
`ddnb.data_pipeline.calculator`; each wrong answer gets the hint its usual cause needs.
"""
from __future__ import annotations

import math

from ddnb._checks import Checks
from ddnb.data_pipeline.calculator import STAGES, pipeline_bound, read_bandwidth, samples_per_s
from ddnb.exercises.core import passed, run_on_ranks
from ddnb.exercises.predict import check_prediction

SHARD_SIZES = ([60, 60, 60, 60, 10], [7, 3, 10, 1, 5], [100], [1, 1, 1, 1, 1, 1, 1], [13, 40, 8])


def _spans_on_rank(fn, cases):
    """On a rank: fn(sizes, world_size, rank) for each case, as plain lists of tuples."""
    import torch.distributed as dist

    out = []
    for sizes in cases:
        spans = fn(list(sizes), dist.get_world_size(), dist.get_rank())
        out.append([tuple(int(v) for v in s) for s in spans])
    return out


def _diagnose_spans(sizes, got, world_size) -> str:
    """'' if got (one list of spans per rank) covers each sample once, balanced and
    contiguous; else what is wrong, with its usual cause."""
    n = sum(sizes)
    owner = {}
    for rank, spans in enumerate(got):
        for k, b, e in spans:
            if not (0 <= k < len(sizes) and 0 <= b <= e <= sizes[k]):
                return (f"rank {rank} returned the span {(k, b, e)}, outside shards {sizes}: a span is (shard, "
                        f"begin, end) with 0 <= begin <= end <= that shard's size")
            for j in range(b, e):
                if (k, j) in owner:
                    return (f"sample {j} of shard {k} is read by rank {owner[(k, j)]} and rank {rank}: the runs "
                            f"overlap. Did every rank take ceil(n / N) samples from rank * ceil(n / N)? The first "
                            f"n mod N ranks take one more, the others start that much later")
                owner[(k, j)] = rank
    missing = [(k, j) for k, s in enumerate(sizes) for j in range(s) if (k, j) not in owner]
    if missing:
        k, j = missing[0]
        return (f"{len(missing)} sample(s) are read by no rank, first sample {j} of shard {k}: floor(n / N) per rank "
                f"drops the last n mod N = {n % world_size}; give one more to the first n mod N ranks")
    counts = [sum(e - b for _, b, e in spans) for spans in got]
    if max(counts) - min(counts) > 1:
        return (f"ranks read {counts} samples: whole shards per rank (rank r takes shards r, r + N, ...) leave the "
                f"ranks unequal when shards are uneven, and synchronous ranks then wait for the slowest; cut the "
                f"epoch's stream of {n} samples into N runs, inside a shard where needed")
    for rank, spans in enumerate(got):
        stream = [sum(sizes[:k]) + j for k, b, e in spans for j in range(b, e)]
        if stream and stream != list(range(stream[0], stream[0] + len(stream))):
            return (f"rank {rank}'s samples are not one contiguous run of the shards laid end to end: a stride over "
                    f"samples (06's ShardSampler) makes every rank open every shard; take a run [lo, hi)")
    return ""


def check_rank_spans(fn, world_size: int = 3, timeout: float = 30) -> str:
    """Run fn(shard_sizes, world_size, rank) on `world_size` real ranks for several shard
    layouts (shards in order 0, 1, ...); every sample must be read by exactly one rank,
    ranks' counts may differ by at most one, and each rank's samples form one run."""
    with Checks("check_rank_spans") as check:
        check.rule(callable(fn), f"fn={fn!r}: need a function fn(shard_sizes, world_size, rank)")
        check.integer("world_size", world_size, min=2, max=7)
    got = run_on_ranks(_spans_on_rank, world_size, fn, SHARD_SIZES, what="your rank_spans", timeout=timeout)
    for c, sizes in enumerate(SHARD_SIZES):
        problem = _diagnose_spans(sizes, [got[r][c] for r in range(world_size)], world_size)
        if problem:
            raise AssertionError(f"shards {sizes} on {world_size} ranks: {problem}")
    return passed("check_rank_spans", f"{len(SHARD_SIZES)} shard layouts on {world_size} ranks: every sample once, "
                                      f"balanced, one run per rank")


def check_read_bandwidth(predicted, *, global_batch: int, step_s: float, bytes_per_sample: float, nodes: int) -> str:
    """Your bytes/s per node against samples_per_s(global_batch, step_s) x bytes_per_sample / nodes
    (within 1%), with a hint for the usual slips (per job instead of per node, bits, MB)."""
    need = read_bandwidth(samples_per_s(global_batch, step_s), bytes_per_sample, nodes)
    hints = {need * nodes: f"that is the whole job's bandwidth; each of the {nodes} nodes reads its share",
             need * 8: "that is in bits per second; the answer is in bytes per second",
             need / 1e6: "that is in MB/s; write bytes per second (e.g. 14.08e6)"}
    why = (f"{global_batch} samples per {step_s} s step = {global_batch / step_s:g} samples/s, x {bytes_per_sample:g} "
           f"bytes, / {nodes} nodes")
    if isinstance(predicted, (int, float)) and not isinstance(predicted, bool):
        for value, hint in hints.items():
            if math.isclose(predicted, value, rel_tol=0.01) and not math.isclose(predicted, need, rel_tol=0.01):
                why = f"{hint}. {why}"
    return check_prediction(predicted, need, what="read bandwidth per node", rel_tol=0.01, unit="bytes/s", why=why)


def check_bound(predicted, **pipeline) -> str:
    """Your stage ("storage", "decode" or "compute") against pipeline_bound(**pipeline)'s."""
    with Checks("check_bound") as check:
        check.rule(predicted in STAGES, f"predicted={predicted!r}: write one of {list(STAGES)}")
    p = pipeline_bound(**pipeline)
    parts = ", ".join(f"{s} {p[s] * 1e3:.3g} ms" for s in STAGES)
    if predicted != p["bound"]:
        hint = ""
        if predicted == "compute" and p["bound"] == "decode":
            hint = (f" Decoding {pipeline.get('batch_size', 256)} samples at {pipeline['decode_s'] * 1e3:g} ms each, "
                    f"shared by {max(pipeline['workers'], 1)} worker(s), takes longer than the step: add workers "
                    f"(and the cores they need) or decode offline.")
        elif p["bound"] == "storage":
            hint = " Each shard costs one open: small shards make storage pay it often (open_s / shard_samples per sample)."
        raise AssertionError(f"you predicted {predicted!r}, the bound is {p['bound']!r} ({parts} per batch).{hint}")
    return passed("check_bound", f"{p['bound']} bounds the step ({parts} per batch)")
