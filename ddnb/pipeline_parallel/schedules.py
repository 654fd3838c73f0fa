"""Pipeline schedules as plain data: for each rank (= stage), the list of actions it runs.

An action is F(j) (the forward of micro-batch j on this stage) or B(j) (its backward).
A schedule is `list[list[Action]]`, one list per rank, so it can be printed, checked,
simulated and drawn without any process running; `ddnb.pipeline_parallel.executor`
runs one on a real pipeline. Naive first, then better:

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

Both have the same bubble: with p stages of equal cost and m micro-batches a step takes
m + p - 1 forward+backward slots of which each rank is busy in m, so the idle fraction is
(p - 1)/(m + p - 1) (GPipe Sec. 2.2; `ddnb.cost.pipeline_bubble_fraction`). They differ
in memory: under GPipe stage 0 holds the activations of all m micro-batches before its
first backward, under 1F1B at most p - rank are in flight, so memory no longer grows
with m (Narayanan et al. 2021, Sec. 2.2.1). `simulate` gives the events of a schedule
with given forward/backward times, in the format of `ddnb.trace`, so the same drawing
(`ddnb.viz.pipeline`) shows a schedule and a measured run.
Taught in `notebooks/09_pipeline_parallelism.ipynb`.
"""
from __future__ import annotations

from typing import NamedTuple

from ddnb._checks import Checks, check_positive_ints

FORWARD, BACKWARD = "F", "B"


class Action(NamedTuple):
    """One step of a rank: op "F" or "B" on micro-batch `microbatch` of its model chunk
    `chunk` (always 0 but in interleaved schedules); prints as F3 / B3, or F3.1 for
    chunk 1."""

    op: str
    microbatch: int
    chunk: int = 0

    def __repr__(self) -> str:
        return f"{self.op}{self.microbatch}" + (f".{self.chunk}" if self.chunk else "")


def _check_counts(check: Checks, stages, microbatches, chunks=None) -> None:
    """stages and microbatches >= 1, and with chunks (interleaved) chunks >= 1 and m % p == 0."""
    counts_ok = check.positive_ints(stages=stages, microbatches=microbatches)
    if chunks is not None:
        check.integer("chunks", chunks, min=1)
        if counts_ok:
            check.rule(microbatches % stages == 0, f"interleaved 1F1B needs microbatches a multiple of stages, "
                       f"got microbatches({microbatches}) % stages({stages}) = {microbatches % stages}")


def gpipe_schedule(stages: int, microbatches: int) -> list[list[Action]]:
    """GPipe ("all forward, all backward"): every rank runs F0..F(m-1), then B0..B(m-1).
    Simple, and its bubble is (p-1)/(m+p-1), but each rank keeps the activations of all m
    micro-batches until its backwards start (Huang et al. 2019, Sec. 2.2)."""
    check_positive_ints("gpipe_schedule", stages=stages, microbatches=microbatches)
    m = microbatches
    return [[Action(FORWARD, j) for j in range(m)] + [Action(BACKWARD, j) for j in range(m)]
            for _ in range(stages)]


def one_f_one_b_schedule(stages: int, microbatches: int) -> list[list[Action]]:
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
    return out


def interleaved_one_f_one_b_schedule(stages: int, microbatches: int, chunks: int = 2) -> list[list[Action]]:
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
    return out


SCHEDULES = {"gpipe": gpipe_schedule, "1f1b": one_f_one_b_schedule, "interleaved": interleaved_one_f_one_b_schedule}


def get_schedule(name: str, stages: int, microbatches: int, chunks: int = 2) -> list[list[Action]]:
    """The schedule called `name` ("gpipe", "1f1b" or "interleaved", the last with
    `chunks` model chunks per rank) for p stages and m micro-batches."""
    with Checks("get_schedule") as check:
        check.choice("schedule", name, SCHEDULES)
        _check_counts(check, stages, microbatches, chunks if name == "interleaved" else None)
    if name == "interleaved":
        return interleaved_one_f_one_b_schedule(stages, microbatches, chunks)
    return SCHEDULES[name](stages, microbatches)


def num_chunks(schedule: list[list[Action]]) -> int:
    """Model chunks per rank: 1 but in interleaved schedules."""
    return 1 + max((a.chunk for acts in schedule for a in acts), default=0)


def _upstream(a: Action, rank: int, p: int, v: int):
    """The (rank, action) that `a` waits for: F(j) on virtual stage s = chunk·p + rank
    needs F(j) on s - 1, B(j) needs B(j) on s + 1; None on the first / last virtual stage."""
    s = a.chunk * p + rank
    t = s - 1 if a.op == FORWARD else s + 1
    if not 0 <= t < p * v:
        return None
    return t % p, Action(a.op, a.microbatch, t // p)


def in_flight(actions: list[Action]) -> int:
    """The most micro-batches whose forward has run and backward has not, at any point of
    one rank's action list: how many micro-batches' activations that stage holds at once."""
    live = peak = 0
    for a in actions:
        live += 1 if a.op == FORWARD else -1
        peak = max(peak, live)
    return peak


def validate_schedule(schedule: list[list[Action]], microbatches: int) -> None:
    """Raise ValueError unless the schedule can run: on every rank each micro-batch has
    exactly one F and one B (per model chunk), F before B; with one chunk, all ranks run
    the forwards in the same order and the backwards in the same order (what first-in
    first-out matching of messages needs, e.g. on NCCL, which ignores tags); and the
    cross-stage dependencies (F(j) on rank r needs F(j) on r-1, B(j) on r needs B(j) on
    r+1; interleaved: on the neighbouring virtual stage) never leave every rank waiting."""
    check_positive_ints("validate_schedule", stages=len(schedule), microbatches=microbatches)
    v = num_chunks(schedule)
    want = sorted((j, c) for j in range(microbatches) for c in range(v))
    problems = []
    for r, acts in enumerate(schedule):
        fwd = [a.microbatch for a in acts if a.op == FORWARD]
        bwd = [a.microbatch for a in acts if a.op == BACKWARD]
        other = [a for a in acts if a.op not in (FORWARD, BACKWARD)]
        if other:
            problems.append(f"rank {r}: unknown actions {other}")
        if (sorted((a.microbatch, a.chunk) for a in acts if a.op == FORWARD) != want
                or sorted((a.microbatch, a.chunk) for a in acts if a.op == BACKWARD) != want):
            problems.append(f"rank {r}: forwards {fwd} and backwards {bwd} must each be micro-batches "
                            f"0..{microbatches - 1} once" + (f" per chunk 0..{v - 1}" if v > 1 else ""))
            continue
        for j, c in want:
            if acts.index(Action(FORWARD, j, c)) > acts.index(Action(BACKWARD, j, c)):
                problems.append(f"rank {r}: {Action(BACKWARD, j, c)!r} before {Action(FORWARD, j, c)!r}")
        if v == 1 and r and fwd != [a.microbatch for a in schedule[0] if a.op == FORWARD]:
            problems.append(f"rank {r}: forward order {fwd} differs from rank 0's")
        if v == 1 and r and bwd != [a.microbatch for a in schedule[0] if a.op == BACKWARD]:
            problems.append(f"rank {r}: backward order {bwd} differs from rank 0's")
    if problems:
        raise ValueError("invalid pipeline schedule: " + "; ".join(problems))
    simulate(schedule)  # raises on a deadlock


def simulate(schedule: list[list[Action]], t_forward=1.0, t_backward=2.0, t_comm=0.0) -> list[dict]:
    """Run the schedule on paper: each rank does its actions in order, each as soon as the
    rank is free and its input has arrived (F(j) on rank r: t_comm after F(j) ends on
    r-1; B(j): t_comm after B(j) ends on r+1). t_forward / t_backward are one stage's
    times (numbers, or per-rank lists; a chunk of an interleaved schedule takes 1/v of
    them); the default 1 : 2 is the usual backward ≈ 2 x forward. Returns "compute"
    events (rank, name "F3", start, end, op, microbatch, chunk), the format of
    `ddnb.trace`; raises ValueError naming the blocked ranks on a deadlock."""
    p, v = len(schedule), num_chunks(schedule)
    tf = list(t_forward) if isinstance(t_forward, (list, tuple)) else [t_forward] * p
    tb = list(t_backward) if isinstance(t_backward, (list, tuple)) else [t_backward] * p
    if len(tf) != p or len(tb) != p:
        raise ValueError(f"need one forward and backward time per rank, got {len(tf)} and {len(tb)} for {p} ranks")
    done: dict[tuple[int, Action], float] = {}            # (rank, action) -> end time
    pos, free = [0] * p, [0.0] * p
    events = []
    while any(pos[r] < len(schedule[r]) for r in range(p)):
        progressed = False
        for r in range(p):
            while pos[r] < len(schedule[r]):
                a = schedule[r][pos[r]]
                dep = _upstream(a, r, p, v)
                if dep is not None:
                    if dep not in done:
                        break
                    ready = done[dep] + t_comm
                else:
                    ready = 0.0
                start = max(free[r], ready)
                end = start + (tf[r] if a.op == FORWARD else tb[r]) / v     # a chunk is 1/v of a stage
                done[(r, a)] = free[r] = end
                events.append({"rank": r, "kind": "compute", "name": repr(a), "start": start, "end": end,
                               "peer": None, "nbytes": 0, "op": a.op, "microbatch": a.microbatch,
                               "chunk": a.chunk})
                pos[r] += 1
                progressed = True
        if not progressed:
            stuck = [f"rank {r} at {schedule[r][pos[r]]!r}" for r in range(p) if pos[r] < len(schedule[r])]
            raise ValueError(f"the schedule deadlocks: {', '.join(stuck)} wait for each other")
    return sorted(events, key=lambda e: (e["start"], e["rank"]))


def bubble_fraction(events: list[dict]) -> float:
    """Measured (or simulated) idle fraction of a pipeline step: 1 - busy / span, averaged
    over ranks, where busy is a rank's total time in "compute" events and span runs from
    the first compute event of any rank to the last one. For equal stages this is the
    analytic (p-1)/(m+p-1); measured, it also holds the communication and imbalance."""
    compute = [e for e in events if e["kind"] == "compute"]
    if not compute:
        raise ValueError("no compute events to measure a bubble from")
    t0, t1 = min(e["start"] for e in compute), max(e["end"] for e in compute)
    ranks = sorted({e["rank"] for e in compute})
    busy = {r: sum(e["end"] - e["start"] for e in compute if e["rank"] == r) for r in ranks}
    return sum(1.0 - busy[r] / (t1 - t0) for r in ranks) / len(ranks)
