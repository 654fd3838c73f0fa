"""All-reduce schedules as plain data: the messages each algorithm of `ddnb.collectives`
sends, step by step, worked out without any process running (as
`ddnb.pipeline_parallel.schedules` does for pipelines).

A schedule is `list[list[Message]]`, one list per step. `Message(src, dst, nbytes, phase,
start, stop, reduce)`: rank `src` sends elements start..stop-1 of the flat tensor
(`nbytes` bytes) to rank `dst`, into the same elements there, and `dst` either ⊕s them
into its own copy (reduce=True) or overwrites its copy with them (reduce=False). Ranks
are ranks of the group; `phase` is the name the algorithm traces the message under
(`ddnb.trace`), so a schedule can be checked message by message against a traced run
(tests/test_collective_schedules.py), drawn (`ddnb.viz.allreduce_steps`) and costed:
in a step every rank sends and receives at most one message (the ring's pipeline
segments aside), so with the alpha-beta model a step costs one alpha plus its largest
message's bytes times beta (`schedule_time`). The four algorithms:

    naive_schedule(N, numel)                  2(N-1) steps: one message each into, then
                                              out of, rank 0 (its link carries one at a time)
    tree_schedule(N, numel)                   ceil(log2 N) rounds of binomial-tree reduce,
                                              as many of broadcast
    ring_schedule(N, numel, segment_bytes=)   N-1 reduce-scatter and N-1 all-gather steps,
                                              one chunk per rank per step, in segments
    halving_doubling_schedule(N, numel)       [fold], log2 p' halving and log2 p'
                                              doubling steps, [unfold]

Within a step the messages are listed by sender, and a sender's messages in the order
it sends them; so the messages of one rank, step after step, are the order it traces
them in. `element_size` (bytes per element, 4 for float32) turns elements into bytes.
Taught in `notebooks/05_allreduce.ipynb`.
"""
from __future__ import annotations

from dataclasses import dataclass

from ddnb._checks import Checks
from ddnb.collectives.halving_doubling import core_rank, split_halves
from ddnb.collectives.naive import ROOT
from ddnb.collectives.ring import SEGMENT_BYTES, chunk_bounds, segment_bounds, segment_elements


@dataclass(frozen=True)
class Message:
    """One point-to-point message of an all-reduce step: rank `src` sends elements
    start..stop-1 of its flat tensor, `nbytes` bytes, traced under the name `phase`, to
    rank `dst`, which ⊕s them into its own (reduce=True) or overwrites its own (False)."""

    src: int
    dst: int
    nbytes: int
    phase: str
    start: int
    stop: int
    reduce: bool


def _check(what: str, world_size, numel, element_size, segment_bytes=1) -> None:
    with Checks(what) as check:
        check.integer("world_size", world_size, min=1)
        check.integer("numel", numel, min=0)
        check.integer("element_size", element_size, min=1)
        check.integer("segment_bytes", segment_bytes, min=1)


def _message(src: int, dst: int, start: int, stop: int, phase: str, reduce: bool, element_size: int) -> Message:
    return Message(src, dst, (stop - start) * element_size, phase, start, stop, reduce)


def naive_schedule(world_size: int, numel: int, element_size: int = 4) -> list[list[Message]]:
    """`ddnb.collectives.naive_allreduce`: every rank r sends its whole tensor to rank 0,
    which ⊕s them in rank order, then rank 0 sends the result to ranks 1..N-1. One message
    per step, since the root's link carries one at a time: 2(N-1) steps of S bytes, the
    2(N-1)(α + Sβ) of Thakur, Rabenseifner & Gropp 2005 (IJHPCA 19(1), Sec. 4)."""
    _check("naive_schedule", world_size, numel, element_size)
    if world_size == 1 or numel == 0:
        return []
    others = [r for r in range(world_size) if r != ROOT]
    return ([[_message(r, ROOT, 0, numel, "gather", True, element_size)] for r in others]
            + [[_message(ROOT, r, 0, numel, "broadcast", False, element_size)] for r in others])


def tree_schedule(world_size: int, numel: int, element_size: int = 4) -> list[list[Message]]:
    """`ddnb.collectives.tree_allreduce`: binomial-tree reduce to rank 0, round k (mask
    2^k) sending from every rank v ≡ 2^k (mod 2^(k+1)) to v - 2^k, then the broadcast
    down the same tree, largest mask first. 2 ceil(log2 N) steps of S bytes: the
    2 ceil(log2 N)(α + Sβ) of Thakur, Rabenseifner & Gropp 2005 (Sec. 4)."""
    _check("tree_schedule", world_size, numel, element_size)
    n = world_size
    if n == 1 or numel == 0:
        return []
    steps, mask = [], 1
    while mask < n:
        steps.append([_message(v, v - mask, 0, numel, "reduce", True, element_size)
                      for v in range(mask, n, 2 * mask)])
        mask <<= 1
    while mask > 1:
        mask >>= 1
        steps.append([_message(v, v + mask, 0, numel, "broadcast", False, element_size)
                      for v in range(0, n - mask, 2 * mask)])
    return steps


def ring_schedule(world_size: int, numel: int, element_size: int = 4,
                  segment_bytes: int = SEGMENT_BYTES) -> list[list[Message]]:
    """`ddnb.collectives.ring_allreduce`: the tensor cut into N chunks (`chunk_bounds`);
    at reduce-scatter step s every rank r sends chunk (r-s-1) mod N to r+1, at all-gather
    step s chunk (r-s) mod N, each chunk as its segments of at most `segment_bytes`
    (Patarasuk & Yuan 2009, JPDC 69(2); Thakur, Rabenseifner & Gropp 2005, Sec. 4).
    2(N-1) steps of S/N bytes per rank: 2(N-1)α + 2(N-1)/N Sβ with one segment
    per chunk. The ring's `depth` (receives in flight) changes when messages move, not
    which: the schedule is the same for every depth. An empty chunk (numel < N) sends
    nothing."""
    _check("ring_schedule", world_size, numel, element_size, segment_bytes)
    n = world_size
    if n == 1 or numel == 0:
        return []
    bounds, seg = chunk_bounds(numel, n), segment_elements(segment_bytes, element_size)

    def step(phase: str, behind: int, reduce: bool) -> list[Message]:   # rank r sends chunk r - behind
        return [_message(r, (r + 1) % n, a, b, phase, reduce, element_size)
                for r in range(n) for a, b in segment_bounds(*bounds[(r - behind) % n], seg)]

    return ([step("reduce-scatter", s + 1, True) for s in range(n - 1)]
            + [step("allgather", s, False) for s in range(n - 1)])


def halving_doubling_schedule(world_size: int, numel: int, element_size: int = 4) -> list[list[Message]]:
    """`ddnb.collectives.halving_doubling_allreduce` (Rabenseifner 2004; Thakur,
    Rabenseifner & Gropp 2005, Sec. 4). With p' the largest power of two <= N and
    rem = N - p': a "fold" step (rank 2i+1 sends its tensor to 2i, i < rem) if rem > 0;
    log2 p' "halving" steps, d = p'/2, ..., 1, in which core ranks v and v XOR d, which
    hold the same elements, each send the half they give away (`split_halves`);
    log2 p' "doubling" steps, d = 1, ..., p'/2, in which each sends the other what it
    holds; an "unfold" step (2i sends the result to 2i+1) if rem > 0.
    2 log2 p' α + 2(p'-1)/p' Sβ, plus 2(α + Sβ) when N is not a power of two. An empty
    half (numel < p') is not sent, but its step stays."""
    _check("halving_doubling_schedule", world_size, numel, element_size)
    n = world_size
    if n == 1 or numel == 0:
        return []
    p2 = 1 << (n.bit_length() - 1)
    rem = n - p2

    def swap(phase: str, d: int, ranges, reduce: bool) -> list[Message]:   # core rank v sends ranges[v]
        return [_message(core_rank(v, rem), core_rank(v ^ d, rem), a, b, phase, reduce, element_size)
                for v, (a, b) in enumerate(ranges) if b > a]

    pairs = range(0, 2 * rem, 2)
    steps = [[_message(r + 1, r, 0, numel, "fold", True, element_size) for r in pairs]] if rem else []
    held, before = [(0, numel)] * p2, []     # the elements core rank v is responsible for
    d = p2 // 2
    while d >= 1:
        halves = [split_halves(*held[v], v < v ^ d) for v in range(p2)]      # (keep, give)
        steps.append(swap("halving", d, [give for _, give in halves], True))
        before.append(held)
        held, d = [keep for keep, _ in halves], d // 2
    d = 1
    for parent in reversed(before):
        steps.append(swap("doubling", d, held, False))
        held, d = parent, d * 2
    if rem:
        steps.append([_message(r, r + 1, 0, numel, "unfold", False, element_size) for r in pairs])
    return steps


SCHEDULES = {"naive": naive_schedule, "tree": tree_schedule, "ring": ring_schedule,
             "halving_doubling": halving_doubling_schedule}


def allreduce_schedule(algorithm: str, world_size: int, numel: int, element_size: int = 4,
                       **kwargs) -> list[list[Message]]:
    """The schedule of `ddnb.collectives.ALLREDUCES[algorithm]` on `world_size` ranks for
    a tensor of `numel` elements; kwargs: the ring's segment_bytes."""
    with Checks("allreduce_schedule") as check:
        check.choice("algorithm", algorithm, SCHEDULES)
    return SCHEDULES[algorithm](world_size, numel, element_size, **kwargs)


def messages_of(schedule: list[list[Message]], rank: int, kind: str = "send") -> list[Message]:
    """The messages `rank` sends (kind "send") or receives ("recv"), step after step: the
    order it traces them in."""
    with Checks("messages_of") as check:
        check.choice("kind", kind, ("send", "recv"))
    return [m for step in schedule for m in step if (m.src if kind == "send" else m.dst) == rank]


def schedule_time(schedule: list[list[Message]], alpha: float, beta: float, gamma: float = 0.0) -> float:
    """Seconds of the schedule under the alpha-beta-gamma model (`ddnb.cost.allreduce_time`):
    the steps one after another, each as long as its busiest rank, which pays alpha per
    message and beta per byte on its busier direction (its link sends and receives at
    once) and gamma per byte it ⊕s. For sizes the chunks divide evenly this is Thakur,
    Rabenseifner & Gropp 2005's formula for every algorithm (tests/test_collective_schedules.py)."""
    total = 0.0
    for step in schedule:
        busiest = 0.0
        for r in {m.src for m in step} | {m.dst for m in step}:
            sent, got = [m for m in step if m.src == r], [m for m in step if m.dst == r]
            link = max(alpha * len(sent) + beta * _bytes(sent), alpha * len(got) + beta * _bytes(got))
            busiest = max(busiest, link + gamma * _bytes(m for m in got if m.reduce))
        total += busiest
    return total


def _bytes(messages) -> int:
    return sum(m.nbytes for m in messages)
