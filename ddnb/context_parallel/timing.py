"""Time one attention forward + backward under each context-parallel scheme on every rank,
in real mode or, what shows the difference, in an emulated cluster (`ddnb.emulate`): the
all-gather form waits for all of K and V before computing, ring attention posts the next
K/V block before computing on the current one, so its messages hide behind compute when
the link is fast enough (Liu et al. 2023, Sec. 3: the block size at which communication
is hidden). A step's time is the slowest rank's, between two barriers. `time_attention`
runs on every rank; `ddnb.bench.context_parallel.emulated_comparison` starts the emulated
World that runs it for each scheme.
Taught in `notebooks/13_sequence_context_expert.ipynb`.
"""
from __future__ import annotations

SCHEMES = ("allgather", "ring")


def time_attention(scheme: str, batch: int = 1, heads: int = 4, seq_len: int = 1024, head_dim: int = 64,
                   causal: bool = True, layout: str = "zigzag", repeats: int = 3, backward: bool = True) -> float:
    """On every rank: the median seconds (emulated ones in an emulated cluster) of
    `repeats` forward (+ backward) passes of `scheme` on this rank's shard, float32."""
    import statistics

    import torch
    import torch.distributed as dist

    from ddnb._checks import Checks
    from ddnb.context_parallel import allgather_attention, ring_attention
    from ddnb.emulate import uncounted
    from ddnb.timing import barrier_and_clock

    with Checks("time_attention") as check:
        check.choice("scheme", scheme, SCHEMES)
        check.positive_ints(repeats=repeats)
    n, r = dist.get_world_size(), dist.get_rank()
    g = torch.Generator().manual_seed(r)
    q, k, v = (torch.randn(batch, heads, seq_len // n, head_dim, generator=g).requires_grad_() for _ in range(3))
    fn = allgather_attention if scheme == "allgather" else ring_attention
    barrier, clock = barrier_and_clock()
    times = []
    for _ in range(repeats + 1):                        # the first is a warm-up
        barrier()
        start = clock()
        out = fn(q, k, v, causal=causal, layout=layout)
        if backward:
            out.sum().backward()
        barrier()
        times.append(clock() - start)
    t = torch.tensor([statistics.median(times[1:])], dtype=torch.float64)
    with uncounted():                        # bookkeeping, after the timed passes
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()
