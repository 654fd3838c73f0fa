"""The formulas of pipeline parallelism: the bubble, the step time and the activation
memory of each schedule, for p stages of equal cost and m micro-batches.

    pipeline_bubble_fraction(p, m)           = (p - 1) / (m + p - 1)
    interleaved_bubble_fraction(p, m, v)     = (p - 1) / (v m + p - 1)   (v model chunks per rank)
    zbh1_bubble_fraction(p, m)               = (p - 1) / (3 m + p - 1)   (ZB-H1, T_F = T_B = T_W)
    model_parallel_idle_fraction(p)          = (p - 1) / p            (m = 1: the naive split)
    pipeline_step_time(p, m, t_f, t_b)       = (m + p - 1) (t_f + t_b)
    peak_microbatches_in_flight(s, p, m, r)  = m (GPipe), min(p - r, m) (1F1B),
                                               min(2(p - r - 1) + (v - 1) p + 1, v m) chunks (interleaved)
    pipeline_activation_bytes(...)           = in flight x bytes one micro-batch keeps

The bubble: a step of m micro-batches on p stages takes m + p - 1 slots of one forward
and one backward (the first micro-batch needs p - 1 slots to reach the last stage, and
its gradient p - 1 to come back); each rank is busy in m of them, so (p - 1)/(m + p - 1)
of the step is idle (Huang et al. 2019, "GPipe", Sec. 2.2, who state the overhead as
O((p-1)/(m+p-1)) and find it negligible for m >= 4p). Narayanan et al. 2021
("Efficient Large-Scale Language Model Training on GPU Clusters", Sec. 2.2.1) give the
same bubble relative to the ideal time, (p - 1)/m; both schedules, GPipe and 1F1B, have
it. Activation memory is where they differ (same paper, same section): GPipe keeps all
m micro-batches of activations before the first backward, 1F1B at most p - rank.
ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", Sec. 2.3, Table 2) splits the
backward into B and W and idles (p - 1)(T_F + T_B - T_W) per rank instead of 1F1B's
(p - 1)(T_F + T_B + T_W). Taught in `notebooks/09_pipeline_parallelism.ipynb` and
`notebooks/09b_zero_bubble.ipynb`.
"""
from __future__ import annotations

from ddnb._checks import Checks, check_positive_ints, is_int

SCHEDULE_NAMES = ("gpipe", "1f1b", "interleaved")


def pipeline_bubble_fraction(stages: int, microbatches: int) -> float:
    """(p - 1)/(m + p - 1): the fraction of a pipeline step each stage is idle, for p equal
    stages and m micro-batches (GPipe, Huang et al. 2019, Sec. 2.2). 0 for one stage;
    tends to 0 as m grows; (p - 1)/p for m = 1."""
    check_positive_ints("pipeline_bubble_fraction", stages=stages, microbatches=microbatches)
    return (stages - 1) / (microbatches + stages - 1)


def interleaved_bubble_fraction(stages: int, microbatches: int, chunks: int) -> float:
    """(p - 1)/(v·m + p - 1): interleaved 1F1B with v model chunks per rank. Each chunk
    is 1/v of a stage, so the fill and drain take (p - 1)/v stage-slots instead of p - 1:
    the bubble relative to the ideal time drops from (p - 1)/m to (p - 1)/(v·m)
    (Narayanan et al. 2021, Sec. 2.2.2). v = 1 is plain 1F1B."""
    check_positive_ints("interleaved_bubble_fraction", stages=stages, microbatches=microbatches, chunks=chunks)
    return (stages - 1) / (chunks * microbatches + stages - 1)


def zbh1_bubble_fraction(stages: int, microbatches: int, t_forward: float = 1.0, t_backward: float = 1.0,
                         t_weight: float = 1.0) -> float:
    """ZB-H1's idle fraction, (p-1)(T_F + T_B - T_W) / (m(T_F + T_B + T_W) + (p-1)(T_F + T_B - T_W)):
    each rank idles (p-1)(T_F + T_B - T_W) (Qi et al. 2024, Sec. 2.3, Table 2) and computes
    m(T_F + T_B + T_W); T_B is the input-gradient pass alone, T_W the weight-gradient
    pass. With T_F = T_B = T_W (the paper's Sec. 2.1 assumption, the default) that is
    (p-1)/(3m + p-1), against 1F1B's (p-1)/(m + p-1) with the same three units of work per
    micro-batch. The paper's schedule assumes m >= p; below it the warm-up is cut short."""
    with Checks("zbh1_bubble_fraction") as check:
        check.positive_ints(stages=stages, microbatches=microbatches)
        for name, t in (("t_forward", t_forward), ("t_backward", t_backward), ("t_weight", t_weight)):
            check.number(name, t, min=0)
    idle = (stages - 1) * max(t_forward + t_backward - t_weight, 0.0)
    busy = microbatches * (t_forward + t_backward + t_weight)
    return idle / (busy + idle) if busy + idle else 0.0


def model_parallel_idle_fraction(stages: int) -> float:
    """(p - 1)/p: the naive layer split (one batch, no micro-batches) keeps one of its p
    ranks busy at a time; the pipeline bubble with m = 1."""
    check_positive_ints("model_parallel_idle_fraction", stages=stages)
    return pipeline_bubble_fraction(stages, 1)


def pipeline_step_time(stages: int, microbatches: int, t_forward: float, t_backward: float) -> float:
    """(m + p - 1)(t_f + t_b): the time of one pipeline step when each stage takes t_f per
    micro-batch forward and t_b per backward and messages are free."""
    with Checks("pipeline_step_time") as check:
        check.positive_ints(stages=stages, microbatches=microbatches)
        check.number("t_forward", t_forward, min=0)
        check.number("t_backward", t_backward, min=0)
    return (microbatches + stages - 1) * (t_forward + t_backward)


def _check_schedule(check: Checks, schedule, stages, microbatches, rank, chunks) -> None:
    """A schedule of SCHEDULE_NAMES on `stages`, and `rank` one of its stages."""
    check.choice("schedule", schedule, SCHEDULE_NAMES)
    check.positive_ints(stages=stages, microbatches=microbatches, chunks=chunks)
    if is_int(stages) and stages >= 1:
        check.integer("rank", rank, min=0, max=stages - 1, why=f" (0 <= rank < stages({stages}))")
    else:
        check.integer("rank", rank, min=0)


def peak_microbatches_in_flight(schedule: str, stages: int, microbatches: int, rank: int = 0,
                                chunks: int = 2) -> int:
    """How many micro-batches' activations stage `rank` holds at its peak: GPipe m (every
    forward runs before the first backward), 1F1B min(p - rank, m) (p - rank - 1 warm-up
    forwards, then one more before each backward; Narayanan et al. 2021, Sec. 2.2.1).
    Interleaved (v = `chunks`): counted in (chunk, micro-batch) pairs, each 1/v of the
    stage's activations: the 2(p - rank - 1) + (v - 1)p warm-up forwards of Megatron-LM's
    schedule plus one, at most v·m."""
    with Checks("peak_microbatches_in_flight") as check:
        _check_schedule(check, schedule, stages, microbatches, rank, chunks)
    if schedule == "interleaved" and chunks > 1:
        return min(2 * (stages - rank - 1) + (chunks - 1) * stages + 1, chunks * microbatches)
    return microbatches if schedule == "gpipe" else min(stages - rank, microbatches)


def pipeline_activation_bytes(schedule: str, stages: int, microbatches: int, bytes_per_microbatch: int,
                              rank: int = 0, chunks: int = 2) -> int:
    """Peak activation bytes of stage `rank`: peak_microbatches_in_flight x the bytes one
    micro-batch's forward keeps on that stage (interleaved: on one of its chunks). For a
    Transformer of L/p layers, batch b, sequence s, width h, heads a that is about
    s·b·h·(34 + 5as/h) bytes per layer in 16-bit (Korthikanti et al. 2022, "Reducing
    Activation Recomputation in Large Transformer Models", Sec. 4.1, Eq. 1)."""
    with Checks("pipeline_activation_bytes") as check:
        _check_schedule(check, schedule, stages, microbatches, rank, chunks)
        check.integer("bytes_per_microbatch", bytes_per_microbatch, min=1)
    return peak_microbatches_in_flight(schedule, stages, microbatches, rank, chunks) * bytes_per_microbatch
