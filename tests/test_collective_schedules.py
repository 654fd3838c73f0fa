"""The all-reduce schedules (ddnb.collectives.schedules) are the messages the real
algorithms send: every algorithm of ddnb.collectives.ALLREDUCES runs with a Tracer on
worlds of 1-6 ranks (powers of two and not), on sizes 0, 1, N-1, N+1, 2N+1, 37 and 1000
elements (most not divisible by N), in three dtypes, the ring also with small pipeline
segments and other depths, and on a group of 4 of 6 ranks. For each rank, the sends it
traced, in order, are exactly the schedule's messages from it, step after step (peer,
bytes and phase name), its receives exactly the schedule's messages to it, and the
bytes it reduced exactly those of the messages the schedule marks reduce=True; and the
steps are the real steps: what a rank sends at step s leaves after what it received
at earlier steps, for the same elements, has arrived. A schedule changed in one
message fails the comparison. Without a cluster, the alpha-beta-gamma time of each
schedule is the formula of ddnb.cost.allreduce_time, and the bytes each rank sends are
ddnb.cost.allreduce_bytes_per_rank.
"""
import dataclasses

import pytest
import torch
import torch.distributed as dist

from ddnb.collectives import ALLREDUCES
from ddnb.collectives.schedules import SCHEDULES, allreduce_schedule, messages_of, schedule_time
from ddnb.cost import allreduce_bytes_per_rank, allreduce_time
from ddnb.trace import Tracer

DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16}


def cases(n):
    """(algorithm, numel, dtype name, kwargs) of every traced run on n ranks."""
    sizes = sorted({0, 1, max(n - 1, 0), n + 1, 2 * n + 1, 37, 1000})
    out = [(algo, numel, "float32", {}) for algo in ALLREDUCES for numel in sizes]
    out += [(algo, numel, dtype, {}) for algo in ALLREDUCES for numel in (n + 1, 37) for dtype in ("float64", "float16")]
    out += [("ring", numel, "float32", {"segment_bytes": seg, "depth": depth})
            for numel in (2 * n + 1, 37, 100) for seg, depth in ((8, 2), (12, 1), (4, 3))]
    return out


def trace_cases(cases, group=None):
    """On every rank: run each case with a fresh Tracer; its send, recv and reduce events."""
    out = []
    for algo, numel, dtype, kwargs in cases:
        tracer = Tracer()
        ALLREDUCES[algo](torch.ones(numel, dtype=DTYPES[dtype]), group=group, tracer=tracer, check=False, **kwargs)
        out.append([e for e in tracer.take() if e["kind"] in ("send", "recv") or e["name"] == "reduce"])
    return out


def on_subgroup(cases):
    """Ranks 2..5 of a world of 6 run the cases on their own group (group ranks 0..3)."""
    from ddnb.collectives.p2p import global_rank, group_ranks

    group = dist.new_group([2, 3, 4, 5])        # every rank takes part in new_group
    if dist.get_rank() < 2:
        return None
    return group_ranks(group), global_rank(group, 1), trace_cases(cases, group)


def numbered(schedule, rank, kind):
    """[(step, message)] of what `rank` sends or receives, in schedule order."""
    return [(s, m) for s, step in enumerate(schedule) for m in step if (m.src if kind == "send" else m.dst) == rank]


def mismatches(schedule, per_rank) -> list[str]:
    """Where the traced events of each rank differ from the schedule (empty: they agree):
    its sends, in order, must be the schedule's messages from it (peer, bytes, phase), its
    receives those to it, its reduced bytes those of the reducing messages to it; and a
    message it sends at step s must leave after every message it received at an earlier
    step carrying some of the same elements has arrived (the data dependency that makes
    the steps steps: what it forwards includes what it received)."""
    problems = []
    for r, events in enumerate(per_rank):
        traced = {kind: [e for e in events if e["kind"] == kind] for kind in ("send", "recv")}
        planned = {kind: numbered(schedule, r, kind) for kind in ("send", "recv")}
        for kind in ("send", "recv"):
            got = [(e["peer"], e["nbytes"], e["name"]) for e in traced[kind]]
            want = [(m.dst if kind == "send" else m.src, m.nbytes, m.phase) for _, m in planned[kind]]
            if got != want:
                problems.append(f"rank {r} {kind}s (peer, bytes, phase): traced {got}, schedule {want}")
        early = [(s, m, e) for (s, m), e in zip(planned["send"], traced["send"])
                 for (s2, m2), e2 in zip(planned["recv"], traced["recv"])
                 if s2 < s and m2.start < m.stop and m.start < m2.stop and e["start"] < e2["end"]]
        if early:
            s, m, e = early[0]
            problems.append(f"rank {r}: {len(early)} sends left before what they depend on arrived, "
                            f"e.g. {m} (step {s})")
        reduced = [e["nbytes"] for e in events if e["kind"] == "compute" and e["nbytes"]]
        want = [m.nbytes for m in messages_of(schedule, r, "recv") if m.reduce]
        if reduced != want:
            problems.append(f"rank {r} reduced bytes: traced {reduced}, schedule {want}")
    return problems


def schedule_of(case, n):
    algo, numel, dtype, kwargs = case
    segment = {"segment_bytes": kwargs["segment_bytes"]} if "segment_bytes" in kwargs else {}
    return allreduce_schedule(algo, n, numel, DTYPES[dtype].itemsize, **segment)


@pytest.fixture(scope="module")
def traces(world):
    """{n: [(case, per-rank events)]} for worlds of 1-6 ranks, and 4 for the subgroup."""
    out = {}
    for n in range(1, 7):
        per_rank = world(n).run(trace_cases, cases(n))
        out[n] = [(case, [events[i] for events in per_rank]) for i, case in enumerate(cases(n))]
    results = [r for r in world(6).run(on_subgroup, cases(4)) if r is not None]
    assert [r[:2] for r in results] == [([2, 3, 4, 5], 3)] * 4      # group rank 1 is global rank 3
    out["group of 4"] = [(case, [r[2][i] for r in results]) for i, case in enumerate(cases(4))]
    return out


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, "group of 4"])
def test_the_real_algorithms_send_their_schedules(traces, n):
    ranks = 4 if n == "group of 4" else n
    bad = [(case, why[:2]) for case, per_rank in traces[n] if (why := mismatches(schedule_of(case, ranks), per_rank))]
    assert not bad, f"{len(bad)} of {len(traces[n])} cases differ: {bad}"
    assert any(events for _, per_rank in traces[n] for events in per_rank) == (ranks > 1)


def _perturbed(schedule, n):
    """Copies of `schedule` (on n ranks) each wrong in one way."""
    first, last = schedule[0][0], schedule[-1][-1]

    def first_replaced(**change):
        return [[dataclasses.replace(first, **change)] + schedule[0][1:]] + schedule[1:]

    return {
        "a message dropped": schedule[:-1] + [schedule[-1][:-1]],
        "a message one element longer": first_replaced(nbytes=first.nbytes + 4),
        "a message to another rank": schedule[:-1] + [schedule[-1][:-1]
                                                      + [dataclasses.replace(last, dst=(last.dst + 1) % n)]],
        "a message copied instead of reduced": first_replaced(reduce=not first.reduce),
        "a phase renamed": first_replaced(phase="other"),
        "the steps reversed": schedule[::-1],
    }


@pytest.mark.parametrize("algo", list(ALLREDUCES))
@pytest.mark.parametrize("n", [2, 5])
def test_a_changed_schedule_fails_the_comparison(traces, algo, n):
    """On 2 ranks the naive and tree schedules reversed keep every rank's order of sends
    and of receives (one each): only the step check sees that rank 1 cannot receive
    the result before it has sent its part."""
    case, per_rank = next((c, p) for c, p in traces[n] if c == (algo, 37, "float32", {}))
    schedule = schedule_of(case, n)
    assert not mismatches(schedule, per_rank)
    for what, wrong in _perturbed(schedule, n).items():
        assert mismatches(wrong, per_rank), f"{algo}: {what} was not caught"


# ---------------------------------------------------------------- no cluster: the cost model
@pytest.mark.parametrize("algo", list(SCHEDULES))
@pytest.mark.parametrize("n", range(1, 9))
def test_the_cost_model_is_the_schedule_costed(algo, n):
    """Thakur, Rabenseifner & Gropp 2005's formulas (ddnb.cost) are the schedule's steps
    added up: one alpha per step, the largest message's bytes times beta, the reduced
    bytes times gamma; and each rank sends the bytes allreduce_bytes_per_rank says.
    840 elements: every chunk and half the same size for N = 1..8."""
    numel, size = 840, 840 * 4
    schedule = allreduce_schedule(algo, n, numel)
    assert schedule_time(schedule, 1e-5, 1e-9, 1e-10) == pytest.approx(
        allreduce_time(algo, size, n, alpha=1e-5, beta=1e-9, gamma=1e-10), rel=1e-12)
    assert len(schedule) == allreduce_time(algo, size, n, alpha=1.0, beta=0.0)
    sent = [sum(m.nbytes for m in messages_of(schedule, r)) for r in range(n)]
    assert sent == pytest.approx(allreduce_bytes_per_rank(algo, size, n), rel=1e-12)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="algorithm='butterfly' is not one of"):
        allreduce_schedule("butterfly", 4, 8)
    with pytest.raises(ValueError, match="world_size=0: need an integer >= 1; numel=-1: need an integer >= 0"):
        allreduce_schedule("ring", 0, -1)
    with pytest.raises(ValueError, match="segment_bytes=0"):
        allreduce_schedule("ring", 4, 8, segment_bytes=0)
