"""The checkers of notebook 01b accept the solutions (and the library's rank_spans) and
reject typical wrong answers with their hints."""
import math

import pytest

from ddnb.data_pipeline.sharding import cut_run as _cut, rank_spans
from ddnb.exercises.data_pipeline import check_bound, check_rank_spans, check_read_bandwidth
from ddnb.exercises.solutions import data_pipeline as solutions

PIPELINE = dict(workers=4, shard_samples=1000, decode_s=3e-3, step_s=0.15, batch_size=256)
NODES = dict(global_batch=4096, step_s=0.5, bytes_per_sample=110e3, nodes=64)


def library_spans(sizes, world_size, rank):
    return rank_spans(sizes, world_size, rank, shuffle=False)


def ceil_spans(sizes, world_size, rank):        # ceil(n / N) each, the last rank's run ending at n: overlaps
    per = math.ceil(sum(sizes) / world_size)
    n = sum(sizes)
    lo = n - per if rank == world_size - 1 else rank * per
    return _cut(sizes, lo, lo + per)


def floor_spans(sizes, world_size, rank):       # floor(n / N) each: the remainder is read by nobody
    per = sum(sizes) // world_size
    return _cut(sizes, rank * per, (rank + 1) * per)


def whole_shards(sizes, world_size, rank):      # shards rank, rank + N, ...: unequal counts
    return [(k, 0, sizes[k]) for k in range(rank, len(sizes), world_size)]


def strided(sizes, world_size, rank):           # samples rank, rank + N, ...: every rank opens every shard
    flat = [(k, j) for k, s in enumerate(sizes) for j in range(s)]
    return [(k, j, j + 1) for k, j in flat[rank::world_size]]


@pytest.mark.parametrize("fn", [solutions.rank_spans, library_spans])
def test_check_rank_spans_accepts_correct_answers(fn):
    assert check_rank_spans(fn).startswith("✓ check_rank_spans")


@pytest.mark.parametrize("fn, hint", [
    (ceil_spans, r"is read by rank \d and rank \d: the runs overlap"),
    (floor_spans, r"read by no rank, .*floor\(n / N\) per rank drops the last n mod N"),
    (whole_shards, r"ranks read \[.*\] samples: whole shards per rank"),
    (strided, r"not one contiguous run .* every rank open every shard"),
])
def test_check_rank_spans_rejects_wrong_answers_with_a_hint(fn, hint):
    with pytest.raises(AssertionError, match=hint):
        check_rank_spans(fn)


def test_check_rank_spans_names_a_rank_that_raises():
    def broken(sizes, world_size, rank):
        if rank == 2:
            raise IndexError("oops")
        return solutions.rank_spans(sizes, world_size, rank)

    with pytest.raises(AssertionError, match="your rank_spans raised on rank 2: IndexError: oops"):
        check_rank_spans(broken)


def test_check_read_bandwidth():
    assert check_read_bandwidth(solutions.READ_BANDWIDTH, **NODES).startswith("✓ check_prediction")
    with pytest.raises(AssertionError, match="whole job's bandwidth; each of the 64 nodes"):
        check_read_bandwidth(solutions.READ_BANDWIDTH * 64, **NODES)
    with pytest.raises(AssertionError, match="in bits per second"):
        check_read_bandwidth(solutions.READ_BANDWIDTH * 8, **NODES)
    with pytest.raises(AssertionError, match="in MB/s"):
        check_read_bandwidth(14.08, **NODES)


def test_check_bound():
    assert check_bound(solutions.BOUND, **PIPELINE).startswith("✓ check_bound")
    with pytest.raises(AssertionError, match="the bound is 'decode'.*add workers"):
        check_bound("compute", **PIPELINE)
    with pytest.raises(AssertionError, match="the bound is 'storage'.*one open"):
        check_bound("compute", **{**PIPELINE, "shard_samples": 1, "decode_s": 0.0})
    with pytest.raises(ValueError, match="predicted='gpu'"):
        check_bound("gpu", **PIPELINE)
