"""A pipeline schedule as data, and its run on paper: the layer under every schedule
generator (`ddnb.pipeline_parallel.schedules`, `ddnb.pipeline_parallel.zero_bubble`) and
the checker (`ddnb.pipeline_parallel.check`).

A schedule is one list of actions per rank. An action is F(j) (the forward of micro-batch
j on one of the rank's model chunks), B(j) (its backward) or W(j). W splits the backward
in two (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", ICLR 2024, arXiv 2401.10241,
Sec. 2): on a rank whose list has W actions, B(j) is the input-gradient pass
only (what the previous stage waits for) and W(j) the weight-gradient pass, which nothing
across stages waits for, so it can run later and fill a bubble.

Each (rank, chunk) holds one virtual stage of the model. `Schedule` is a list that also
says which (`placement[r][c]`); a plain list of lists, or a Schedule that does not say,
has the looped placement of interleaved 1F1B, virtual stage c·p + r (Narayanan et al.
2021, Sec. 2.2.2). The V placement of ZB-V and DualPipeV gives rank r the stages r and
2p-1-r: the model goes down the ranks and back up, and its first and last stage sit on
rank 0 (Qi et al. 2024, Sec. 6, Fig. 8). Consecutive virtual stages on the same rank (the
V's turn, p-1 and p on rank p-1) hand over locally, with no message.
`parse_schedule` reads one written as text, a line per rank. Taught in
`notebooks/09_pipeline_parallelism.ipynb` and `notebooks/09b_zero_bubble.ipynb`.
"""
from __future__ import annotations

from typing import NamedTuple

FORWARD, BACKWARD, WEIGHT = "F", "B", "W"
OPS = (FORWARD, BACKWARD, WEIGHT)


class Action(NamedTuple):
    """One step of a rank: op "F", "B" or "W" on micro-batch `microbatch` of its model
    chunk `chunk` (always 0 but with several chunks per rank); prints as F3 / B3 / W3, or
    F3.1 for chunk 1."""

    op: str
    microbatch: int
    chunk: int = 0

    def __repr__(self) -> str:
        return f"{self.op}{self.microbatch}" + (f".{self.chunk}" if self.chunk else "")


def parse_actions(text: str, rank: int = 0) -> list[Action]:
    """"F0 F1 B0 W0 F2.1 ..." -> [Action("F", 0), ...]: one rank's list as `repr` prints
    it (op, micro-batch, optionally ".chunk"), separated by spaces or commas; ValueError
    naming the rank and the word that is not an action."""
    out = []
    for word in text.replace(",", " ").split():
        op = word[:1].upper()
        mb, _, chunk = word[1:].partition(".")
        if op not in OPS or not mb.isdigit() or (chunk and not chunk.isdigit()):
            raise ValueError(f"rank {rank}: {word!r} is not an action: write F3, B3 or W3 (op and micro-batch), "
                             f"F3.1 for chunk 1")
        out.append(Action(op, int(mb), int(chunk or 0)))
    return out


def parse_schedule(text: str, placement=None) -> Schedule:
    """A schedule written as text, one line per rank ("F0 F1 B0 W0 ..."; blank lines and
    lines starting with # skipped), as a `Schedule` with `placement` ("looped", "v", or a
    placement[r][c] list; None: looped)."""
    lines = [ln.split("#", 1)[0] for ln in text.splitlines()]
    ranks = [parse_actions(ln, r) for r, ln in enumerate(x for x in lines if x.strip())]
    if placement == "v":
        placement = v_placement(len(ranks))
    elif placement in (None, "looped"):
        placement = None
    return Schedule(ranks, placement=placement)


def looped_placement(ranks: int, chunks: int) -> list[list[int]]:
    """placement[r][c] = c·p + r: chunk c of every rank is one more lap of the ranks."""
    return [[c * ranks + r for c in range(chunks)] for r in range(ranks)]


def v_placement(ranks: int) -> list[list[int]]:
    """placement[r] = [r, 2p-1-r]: down the ranks with chunk 0, back up with chunk 1."""
    return [[r, 2 * ranks - 1 - r] for r in range(ranks)]


def num_chunks(schedule: list[list[Action]]) -> int:
    """Model chunks per rank: 1 but where a rank holds several virtual stages."""
    given = getattr(schedule, "_placement", None)
    if given:
        return max(len(row) for row in given)
    return 1 + max((a.chunk for acts in schedule for a in acts), default=0)


class Schedule(list):
    """A schedule (one list of actions per rank) that knows its placement:
    `placement[r][c]` is the virtual stage that chunk c of rank r holds. Without one,
    `placement` is the looped c·p + r, so a Schedule compares, prints and runs as the
    plain list of lists it is (equality ignores the placement)."""

    def __init__(self, ranks=(), placement=None):
        super().__init__(list(acts) for acts in ranks)
        self._placement = None if placement is None else [list(row) for row in placement]

    @property
    def placement(self) -> list[list[int]]:
        if self._placement is not None:
            return [list(row) for row in self._placement]
        return looped_placement(len(self), num_chunks(self))


def placement_of(schedule: list[list[Action]]) -> list[list[int]]:
    """The schedule's placement[r][c] (virtual stage of chunk c on rank r): a Schedule's
    own, or the looped c·p + r for a plain list."""
    if isinstance(schedule, Schedule):
        return schedule.placement
    return looped_placement(len(schedule), num_chunks(schedule))


def stage_owners(placement: list[list[int]]) -> dict[int, tuple[int, int]]:
    """virtual stage -> (rank, chunk) that holds it."""
    return {s: (r, c) for r, row in enumerate(placement) for c, s in enumerate(row)}


def _upstream(a: Action, rank: int, placement: list[list[int]], owners: dict | None = None):
    """The (rank, action) on the neighbouring virtual stage that `a` waits for: F(j) on
    stage s needs F(j) on s - 1, B(j) needs B(j) on s + 1 (the input gradient: with W split
    off, B waits for B alone, Qi et al. 2024, Sec. 2); None for W (it needs only its own
    B, on its own rank), for F on the first and B on the last virtual stage."""
    owners = stage_owners(placement) if owners is None else owners
    if a.op == WEIGHT:
        return None
    t = placement[rank][a.chunk] + (-1 if a.op == FORWARD else 1)
    if t not in owners:
        return None
    r, c = owners[t]
    return r, Action(a.op, a.microbatch, c)


def in_flight(actions: list[Action], until: str | None = None) -> int:
    """The most (micro-batch, chunk) pairs whose activations one rank holds at once: held
    from F until W when the list has W actions (ZB's B frees part of them, W the rest),
    else until B. until="B" counts only up to B: the whole activations, not the part that
    only W still needs (M_B against M_W in Qi et al. 2024, Sec. 2.3, Table 1)."""
    until = until or (WEIGHT if any(a.op == WEIGHT for a in actions) else BACKWARD)
    live = peak = 0
    for a in actions:
        live += 1 if a.op == FORWARD else -1 if a.op == until else 0
        peak = max(peak, live)
    return peak


def _per_rank(name: str, value, p: int) -> list[float]:
    values = list(value) if isinstance(value, (list, tuple)) else [value] * p
    if len(values) != p:
        raise ValueError(f"need one {name} per rank, got {len(values)} for {p} ranks")
    return values


def simulate(schedule: list[list[Action]], t_forward=1.0, t_backward=2.0, t_comm=0.0,
             t_weight=None) -> list[dict]:
    """Run the schedule on paper: each rank does its actions in order, each as soon as the
    rank is free and its input has arrived: F(j) t_comm after F(j) ends on the previous
    virtual stage, B(j) t_comm after B(j) ends on the next (no t_comm between two stages
    of the same rank). Sends never block (as in `ddnb.pipeline_parallel.executor`, which
    waits for its sends only at the end of the step), so the dependencies are all there is.

    t_forward / t_backward are one whole stage's times (numbers, or per-rank lists; a
    chunk takes 1/v of them): t_backward is the full backward, input and weight gradients.
    Where a rank's list has W actions, W(j) takes t_weight and B(j) the rest,
    t_backward - t_weight; t_weight defaults to t_backward / 2, the T_B = T_W of Qi et al.
    2024 (Sec. 2.1). So the default 1 : 2 is F = 1, B = 2 without W and F = B = W = 1 with
    it: the same work per micro-batch either way. Returns "compute" events (rank, name
    "F3", start, end, op, microbatch, chunk, stage), the format of `ddnb.trace`; raises
    ValueError on a deadlock, naming every blocked rank, its action and what it waits for."""
    p, v = len(schedule), num_chunks(schedule)
    placement = placement_of(schedule)
    owners = stage_owners(placement)
    tf, tb = _per_rank("forward time", t_forward, p), _per_rank("backward time", t_backward, p)
    tw = [b / 2 for b in tb] if t_weight is None else _per_rank("weight-gradient time", t_weight, p)
    if any(w > b for w, b in zip(tw, tb)):
        raise ValueError(f"t_weight ({tw}) is part of t_backward ({tb}): it cannot be larger")
    split = [any(a.op == WEIGHT for a in acts) for acts in schedule]
    cost = [{FORWARD: tf[r] / v, BACKWARD: (tb[r] - tw[r] if split[r] else tb[r]) / v, WEIGHT: tw[r] / v}
            for r in range(p)]
    done: dict[tuple[int, Action], float] = {}            # (rank, action) -> end time
    pos, free = [0] * p, [0.0] * p
    events = []
    while any(pos[r] < len(schedule[r]) for r in range(p)):
        progressed = False
        for r in range(p):
            while pos[r] < len(schedule[r]):
                a = schedule[r][pos[r]]
                dep = _upstream(a, r, placement, owners)
                if dep is not None and dep not in done:
                    break
                ready = 0.0 if dep is None else done[dep] + (t_comm if dep[0] != r else 0.0)
                start = max(free[r], ready)
                done[(r, a)] = free[r] = end = start + cost[r][a.op]
                events.append({"rank": r, "kind": "compute", "name": repr(a), "start": start, "end": end,
                               "peer": None, "nbytes": 0, "op": a.op, "microbatch": a.microbatch,
                               "chunk": a.chunk, "stage": placement[r][a.chunk]})
                pos[r] += 1
                progressed = True
        if not progressed:
            raise ValueError("the schedule deadlocks: " + "; ".join(
                _waiting(r, schedule[r][pos[r]], placement, owners) for r in range(p) if pos[r] < len(schedule[r])))
    return sorted(events, key=lambda e: (e["start"], e["rank"]))


def _waiting(r: int, a: Action, placement, owners) -> str:
    dr, da = _upstream(a, r, placement, owners)
    whence = "later in its own list" if dr == r else f"from rank {dr}"
    return f"rank {r} at {a!r} waits for {da!r} (virtual stage {placement[dr][da.chunk]}) {whence}"


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
