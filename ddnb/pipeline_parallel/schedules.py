"""Pipeline schedules as plain data: for each rank (= stage), the list of actions it runs.

An action is F(j) (the forward of micro-batch j on this stage) or B(j) (its backward),
or, where the backward is split, W(j) (its weight gradient). A schedule is
`list[list[Action]]`, one list per rank (a `Schedule` also says which virtual stage each
chunk holds; `ddnb.pipeline_parallel.actions`), so it can be printed, checked
(`validate_schedule`, `ddnb.pipeline_parallel.check`), simulated and drawn without any
process running; `ddnb.pipeline_parallel.executor` runs one on a real pipeline. Naive
first, then better:

    gpipe_schedule(p, m)          all forwards, then all backwards (Huang et al. 2019,
                                  "GPipe", Sec. 2.2 and Fig. 2c; picotron's "AFAB")
    one_f_one_b_schedule(p, m)    warm-up forwards, then one forward / one backward,
                                  then the cool-down backwards: PipeDream-Flush
                                  (Narayanan et al. 2021, "Efficient Large-Scale Language
                                  Model Training on GPU Clusters", Sec. 2.2.1, Fig. 4 top;
                                  first in Narayanan et al. 2019 "PipeDream", Sec. 3.2)
    interleaved_one_f_one_b_schedule(p, m, v)
                                  1F1B over v model chunks per rank (Sec. 2.2.2): the
                                  bubble divided by v, for v times the messages
    zbh1, zbv, dualpipev          the backward split into B and W, the W's filling the
                                  bubbles (`ddnb.pipeline_parallel.zero_bubble`)

GPipe and 1F1B have the same bubble: with p stages of equal cost and m micro-batches a
step takes m + p - 1 forward+backward slots of which each rank is busy in m, so the idle
fraction is (p - 1)/(m + p - 1) (GPipe Sec. 2.2; `ddnb.cost.pipeline_bubble_fraction`).
They differ in memory: under GPipe stage 0 holds the activations of all m micro-batches
before its first backward, under 1F1B at most p - rank are in flight, so memory no
longer grows with m (Narayanan et al. 2021, Sec. 2.2.1). `simulate` gives the events of
a schedule with given forward/backward times, in the format of `ddnb.trace`, so the same
drawing (`ddnb.viz.pipeline`) shows a schedule and a measured run.
Taught in `notebooks/09_pipeline_parallelism.ipynb`.
"""
from __future__ import annotations

from ddnb._checks import Checks, check_positive_ints
from ddnb.pipeline_parallel.actions import (BACKWARD, FORWARD, OPS, WEIGHT, Action, Schedule,  # noqa: F401
                                            bubble_fraction, in_flight, looped_placement, num_chunks,
                                            placement_of, simulate, v_placement)
from ddnb.pipeline_parallel.check import ScheduleReport, validate_schedule  # noqa: F401
from ddnb.pipeline_parallel.zero_bubble import check_dualpipev_counts, dualpipev_schedule, zbh1_schedule, zbv_schedule


def _check_counts(check: Checks, stages, microbatches, chunks=None) -> bool:
    """stages and microbatches >= 1, and with chunks (interleaved) chunks >= 1 and m % p == 0;
    whether the counts themselves were integers >= 1."""
    counts_ok = check.positive_ints(stages=stages, microbatches=microbatches)
    if chunks is not None:
        check.integer("chunks", chunks, min=1)
        if counts_ok:
            check.rule(microbatches % stages == 0, f"interleaved 1F1B needs microbatches a multiple of stages, "
                       f"got microbatches({microbatches}) % stages({stages}) = {microbatches % stages}")
    return counts_ok


def gpipe_schedule(stages: int, microbatches: int) -> Schedule:
    """GPipe ("all forward, all backward"): every rank runs F0..F(m-1), then B0..B(m-1).
    Simple, and its bubble is (p-1)/(m+p-1), but each rank keeps the activations of all m
    micro-batches until its backwards start (Huang et al. 2019, Sec. 2.2)."""
    check_positive_ints("gpipe_schedule", stages=stages, microbatches=microbatches)
    m = microbatches
    return Schedule([Action(FORWARD, j) for j in range(m)] + [Action(BACKWARD, j) for j in range(m)]
                    for _ in range(stages))


def one_f_one_b_schedule(stages: int, microbatches: int) -> Schedule:
    """1F1B (PipeDream-Flush, Narayanan et al. 2021, Sec. 2.2.1): rank r first runs
    w = min(p - r - 1, m) warm-up forwards, then alternates F(w + i), B(i) until the
    forwards are done, then runs the remaining backwards. The last stage starts each
    backward as soon as its forward is done, so a micro-batch's activations are freed
    after at most p - r others have entered: at most min(p - r, m) in flight on rank r.
    Same bubble as GPipe, same gradients (the same sum over micro-batches)."""
    check_positive_ints("one_f_one_b_schedule", stages=stages, microbatches=microbatches)
    p, m = stages, microbatches
    out = []
    for r in range(p):
        warmup = min(p - r - 1, m)
        acts = [Action(FORWARD, j) for j in range(warmup)]
        for i in range(m - warmup):                       # steady state: one F, one B
            acts += [Action(FORWARD, warmup + i), Action(BACKWARD, i)]
        acts += [Action(BACKWARD, j) for j in range(m - warmup, m)]   # cool-down
        out.append(acts)
    return Schedule(out)


def interleaved_one_f_one_b_schedule(stages: int, microbatches: int, chunks: int = 2) -> Schedule:
    """Interleaved 1F1B (Narayanan et al. 2021, Sec. 2.2.2, Fig. 4 bottom; the order of
    Megatron-LM's `forward_backward_pipelining_with_interleaving`): the model is cut into
    v·p pieces and rank r holds v of them, the virtual stages r, p + r, 2p + r, ... (its
    model chunks 0..v-1). Micro-batches go through the ranks in groups of p, chunk by
    chunk; each rank runs 2(p - r - 1) + (v - 1)p warm-up forwards, then one forward, one
    backward. Each piece is 1/v of a stage, so the bubble shrinks by v to
    (p-1)/(v·m + p - 1), at the price of v times the messages. Needs m % p == 0."""
    with Checks("interleaved_one_f_one_b_schedule") as check:
        _check_counts(check, stages, microbatches, chunks)
    p, m, v = stages, microbatches, chunks
    if v == 1:
        return one_f_one_b_schedule(p, m)                 # Megatron-LM, too, falls back to plain 1F1B
    total = m * v                                         # forwards per rank, one per (chunk, micro-batch)

    def action(op, k):                                    # the k-th forward / backward of a rank
        group, within = divmod(k, p * v)
        chunk = within // p
        return Action(op, group * p + within % p, chunk if op == FORWARD else v - 1 - chunk)

    out = []
    for r in range(p):
        warmup = min((p - r - 1) * 2 + (v - 1) * p, total)
        acts = [action(FORWARD, k) for k in range(warmup)]
        for i in range(total - warmup):
            acts += [action(FORWARD, warmup + i), action(BACKWARD, i)]
        acts += [action(BACKWARD, k) for k in range(total - warmup, total)]
        out.append(acts)
    return Schedule(out)


SCHEDULES = {"gpipe": gpipe_schedule, "1f1b": one_f_one_b_schedule, "interleaved": interleaved_one_f_one_b_schedule,
             "zbh1": zbh1_schedule, "zbv": zbv_schedule, "dualpipev": dualpipev_schedule}
V_SHAPED = ("zbv", "dualpipev")   # two chunks per rank, V placement


def get_schedule(name: str, stages: int, microbatches: int, chunks: int = 2) -> Schedule:
    """The schedule called `name` for p stages and m micro-batches: "gpipe", "1f1b",
    "interleaved" (with `chunks` model chunks per rank), "zbh1", "zbv" or "dualpipev"
    (these two always 2 chunks per rank, in a V; DualPipeV needs m >= 2p)."""
    with Checks("get_schedule") as check:
        check.choice("schedule", name, SCHEDULES)
        counts_ok = _check_counts(check, stages, microbatches, chunks if name == "interleaved" else None)
        if name in V_SHAPED:
            check.rule(chunks == 2, f"{name} holds 2 chunks per rank (V placement), got chunks={chunks!r}")
        if name == "dualpipev" and counts_ok:
            check_dualpipev_counts(check, stages, microbatches)
    if name == "interleaved":
        return interleaved_one_f_one_b_schedule(stages, microbatches, chunks)
    return SCHEDULES[name](stages, microbatches)
