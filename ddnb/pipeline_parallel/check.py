"""The static checker: before any process starts, prove that a pipeline schedule (one
list of actions per rank, `ddnb.pipeline_parallel.actions`) can run, and say what it
costs.

    report = validate_schedule(zbh1_schedule(4, 8), 8)
    report.peak_in_flight    # [4, 4, 4, 4]: micro-batches held from F until W, per rank
    report.bubble            # 0.111: idle fraction with F = B = W = 1
    validate_schedule(broken, 8)   # ValueError: invalid pipeline schedule: rank 2: W3 before B3

It proves, in this order, and stops at the first kind of failure:
  placement  each rank's chunks hold distinct virtual stages, together 0..p·v-1;
  complete   on every rank each F and B, and W where the schedule splits the backward
             (all ranks or none), exactly once per micro-batch and chunk;
  ordered    the dependencies inside a rank: B(j) after F(j), W(j) after B(j) (Qi et al.
             2024, "Zero Bubble Pipeline Parallelism", Sec. 2), and between two
             consecutive virtual stages of the same rank (the V's turn); with one chunk,
             all ranks send forwards in one order and backwards in one order (what
             first-in first-out matching of messages needs, e.g. NCCL's);
  no deadlock  the ranks walk their lists on paper (`ddnb.pipeline_parallel.actions.simulate`):
             F(j) waits for F(j) on the previous virtual stage, B(j) for B(j) on the next.
             That is the executor's whole discipline: `run_schedule` posts each send
             together with the receive of its next action and waits for the sends only at
             the end of the step (`PipelineStage.flush`), so a rank blocks on receives
             alone. (On NCCL `p2p.post` gets one coalesced work for a send and its
             receive, so waiting for the receive also waits for that send; not modelled.)
Each error names the rank and its first offending action, a deadlock every blocked rank
and what it waits for. On success it returns a `ScheduleReport`.
Taught in `notebooks/09_pipeline_parallelism.ipynb`; the zero-bubble schedules it checks in
`notebooks/09b_zero_bubble.ipynb`.
"""
from __future__ import annotations

from dataclasses import dataclass

from ddnb._checks import check_positive_ints
from ddnb.pipeline_parallel.actions import (BACKWARD, FORWARD, OPS, WEIGHT, Action, _upstream, bubble_fraction,
                                            in_flight, placement_of, simulate, stage_owners)


@dataclass(frozen=True)
class ScheduleReport:
    """What a schedule costs on the unit-cost model of Qi et al. 2024 (Sec. 2.1: T_F = T_B
    = T_W): F = B = W = 1 for a whole stage, a full backward (B without W) = 2; a chunk
    of a rank with v chunks takes 1/v. Memory is counted in (micro-batch, chunk) pairs
    held at once, the measure behind the paper's "same memory as 1F1B" (p·M_B, M_B one
    micro-batch's activations on one stage): divide by v for whole stages."""

    peak_in_flight: list[int]    # per rank: held from F until W (until B without W): B frees part, W the rest
    peak_until_b: list[int]      # per rank: held from F until B, the whole activations (M_B each)
    bubble: float                # idle fraction of the step, `bubble_fraction` of the unit-cost run
    step_time: float             # the step's length on that model
    chunks: int                  # model chunks (virtual stages) per rank
    split_backward: bool         # whether the schedule has W actions


def placement_problems(placement, p: int, v: int) -> list[str]:
    """[] when `placement` gives each of p ranks v distinct virtual stages, together
    0..p·v-1; else the problem in words (one item)."""
    flat = [s for row in placement for s in row]
    if len(placement) != p or any(len(row) != v for row in placement) or sorted(flat) != list(range(p * v)):
        return [f"placement {placement} must give each of the {p} ranks {v} distinct virtual stages, "
                f"together 0..{p * v - 1}"]
    return []


def _first_problem(r: int, acts, m: int, v: int, split: bool, placement, owners) -> str | None:
    """The first action of rank r that breaks a rule of its own list, in words."""
    seen: set[Action] = set()
    for a in acts:
        if not isinstance(a, Action) or a.op not in OPS:
            return f"rank {r}: unknown action {a!r} (need an Action(op, microbatch, chunk), op one of {OPS})"
        if not (isinstance(a.microbatch, int) and 0 <= a.microbatch < m):
            return f"rank {r}: {a!r} is for micro-batch {a.microbatch!r}, the step has micro-batches 0..{m - 1}"
        if not (isinstance(a.chunk, int) and 0 <= a.chunk < v):
            return f"rank {r}: {a!r} is for chunk {a.chunk!r}, the rank holds chunks 0..{v - 1}"
        if a in seen:
            return (f"rank {r}: {a!r} runs twice; each F, B{' and W' if split else ''} must run exactly once "
                    f"per micro-batch and virtual stage")
        before = {BACKWARD: Action(FORWARD, a.microbatch, a.chunk), WEIGHT: Action(BACKWARD, a.microbatch, a.chunk)}
        if a.op in before and before[a.op] not in seen:
            return f"rank {r}: {a!r} before {before[a.op]!r}"
        dep = _upstream(a, r, placement, owners)
        if dep is not None and dep[0] == r and dep[1] not in seen:   # the neighbouring stage is on this rank
            return (f"rank {r}: {a!r} before {dep[1]!r} (virtual stage {placement[r][dep[1].chunk]} "
                    f"{'feeds' if a.op == FORWARD else 'returns to'} {placement[r][a.chunk]} on this rank)")
        seen.add(a)
    ops = (FORWARD, BACKWARD, WEIGHT) if split else (FORWARD, BACKWARD)
    for j in range(m):
        for c in range(v):
            for op in ops:
                if Action(op, j, c) not in seen:
                    return f"rank {r}: micro-batch {j} has no {op} on virtual stage {placement[r][c]}"
    return None


def _order_problems(schedule) -> list[str]:
    """With one chunk: every rank forwards and backwards in rank 0's order (FIFO matching)."""
    out = []
    order = [([a.microbatch for a in acts if a.op == FORWARD], [a.microbatch for a in acts if a.op == BACKWARD])
             for acts in schedule]
    for r in range(1, len(schedule)):
        for k, what in enumerate(("forward", "backward")):
            if order[r][k] != order[0][k]:
                out.append(f"rank {r}: {what} order {order[r][k]} differs from rank 0's")
    return out


def validate_schedule(schedule: list[list[Action]], microbatches: int) -> ScheduleReport:
    """Raise ValueError unless `schedule` (a list per rank, or a `Schedule` with its
    placement) can run `microbatches` micro-batches (the module's docstring lists what is
    proven); return its `ScheduleReport` (peak in flight per rank, unit-cost bubble and
    step length). Callers that only want the check can ignore the report."""
    check_positive_ints("validate_schedule", stages=len(schedule), microbatches=microbatches)
    p, m = len(schedule), microbatches
    placement = placement_of(schedule)
    v = max(len(row) for row in placement) if placement else 1
    problems = placement_problems(placement, p, v)
    if problems:
        raise ValueError("invalid pipeline schedule: " + "; ".join(problems))
    owners = stage_owners(placement)
    split = [any(isinstance(a, Action) and a.op == WEIGHT for a in acts) for acts in schedule]
    if any(split) and not all(split):
        with_w = [r for r in range(p) if split[r]]
        problems = [f"rank {r}: no W actions while rank(s) {with_w} have them (a schedule splits the backward "
                    f"into B and W on every rank or on none)" for r in range(p) if not split[r]]
    else:
        problems = [x for r, acts in enumerate(schedule)
                    if (x := _first_problem(r, acts, m, v, split[r], placement, owners)) is not None]
    if not problems and v == 1:
        problems = _order_problems(schedule)
    if problems:
        raise ValueError("invalid pipeline schedule: " + "; ".join(problems))
    events = simulate(schedule)   # F = 1, B = 2 or B = W = 1; raises on a deadlock
    return ScheduleReport(
        peak_in_flight=[in_flight(acts) for acts in schedule],
        peak_until_b=[in_flight(acts, until=BACKWARD) for acts in schedule],
        bubble=bubble_fraction(events),
        step_time=max(e["end"] for e in events) - min(e["start"] for e in events),
        chunks=v, split_backward=all(split))
