"""Solutions of `ddnb.exercises.data_pipeline`, taught in `notebooks/01b_data_pipeline.ipynb`."""
from __future__ import annotations


def rank_spans(shard_sizes, world_size, rank):
    """Lay the shards end to end and give rank r the run [r·q + min(r, m), (r+1)·q + min(r+1, m))."""
    q, m = divmod(sum(shard_sizes), world_size)
    lo, hi = rank * q + min(rank, m), (rank + 1) * q + min(rank + 1, m)
    spans, offset = [], 0
    for k, size in enumerate(shard_sizes):
        begin, end = max(lo, offset), min(hi, offset + size)
        if begin < end:
            spans.append((k, begin - offset, end - offset))
        offset += size
    return spans


READ_BANDWIDTH = 4096 / 0.5 * 110e3 / 64      # bytes/s per node: samples/s x bytes/sample / nodes = 14.08e6
BOUND = "decode"                              # 256 x 3 ms / 4 workers = 192 ms > the 150 ms step
