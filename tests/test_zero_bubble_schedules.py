"""Schedules with the backward split into B and W (ZB-H1, ZB-V, DualPipeV) and the static
checker: every built-in schedule passes it and gets its report; broken ones (a deadlock,
a W before its B, a missing micro-batch, a V order on the looped placement) are refused
naming the rank and the first offending action; ZB-H1 has a third of 1F1B's bubble at
1F1B's memory (Qi et al. 2024, Sec. 2), ZB-V (nearly) none at the same memory (Sec. 6);
ZB-V's and DualPipeV's orders are torch.distributed.pipelining's, action for action; a
schedule written as text (one line per rank) reads back as the same Schedule.
Pure Python, no process starts."""
from types import SimpleNamespace

import pytest

from ddnb.pipeline_parallel import (SCHEDULES, Action, Schedule, dualpipev_schedule, get_schedule, in_flight,
                                    one_f_one_b_schedule, placement_of, simulate, validate_schedule, zbh1_schedule,
                                    zbv_schedule)


def F(j, c=0):
    return Action("F", j, c)


def B(j, c=0):
    return Action("B", j, c)


def W(j, c=0):
    return Action("W", j, c)


CASES = [(name, p, m) for name in SCHEDULES for p in (1, 2, 3, 4) for m in (1, 2, 3, 4, 5, 8, 12)
         if not (name == "interleaved" and m % p) and not (name == "dualpipev" and m < 2 * p)]


# ---------------------------------------------------------------- every built-in schedule passes
@pytest.mark.parametrize("name, p, m", CASES)
def test_every_builtin_schedule_passes_the_checker(name, p, m):
    schedule = get_schedule(name, p, m)
    report = validate_schedule(schedule, m)
    v = report.chunks
    assert v == (2 if name in ("interleaved", "zbv", "dualpipev") else 1)
    assert report.split_backward == (name in ("zbh1", "zbv", "dualpipev"))
    ops = "FBW" if report.split_backward else "FB"
    for acts in schedule:                                   # complete: each action exactly once
        assert sorted(acts) == sorted(Action(op, j, c) for op in ops for j in range(m) for c in range(v))
    # dependencies in the simulated run, through the placement (V or looped)
    placement = placement_of(schedule)
    owner = {s: (r, c) for r, row in enumerate(placement) for c, s in enumerate(row)}
    end = {(e["rank"], Action(e["op"], e["microbatch"], e["chunk"])): e for e in simulate(schedule)}
    for (r, a), e in end.items():
        s = placement[r][a.chunk]
        if a.op == "F" and s > 0:
            assert e["start"] >= end[owner[s - 1][0], F(a.microbatch, owner[s - 1][1])]["end"]
        if a.op == "B" and s < p * v - 1:
            assert e["start"] >= end[owner[s + 1][0], B(a.microbatch, owner[s + 1][1])]["end"]
        if a.op == "W":
            assert e["start"] >= end[r, B(a.microbatch, a.chunk)]["end"]
    assert report.peak_in_flight == [in_flight(acts) for acts in schedule]
    assert 0.0 <= report.bubble < 1.0 and report.step_time >= 3 * m    # each rank works 3m units


def test_placement_is_data():
    assert zbv_schedule(3, 5).placement == [[0, 5], [1, 4], [2, 3]]            # rank r: r and 2p-1-r
    assert dualpipev_schedule(2, 4).placement == [[0, 3], [1, 2]]
    looped = get_schedule("interleaved", 2, 4)
    assert isinstance(looped, Schedule) and looped.placement == [[0, 2], [1, 3]] == placement_of(list(looped))
    assert placement_of([[F(0), B(0)]] * 3) == [[0], [1], [2]]
    assert zbh1_schedule(2, 2) == [list(acts) for acts in zbh1_schedule(2, 2)]  # compares as the plain list
    # the V's turn is local: F(j) on stage p runs right after F(j) on stage p-1, no message time
    events = simulate(zbv_schedule(2, 3), t_comm=10.0)
    end = {(e["rank"], e["name"]): e for e in events}
    assert end[1, "F0.1"]["start"] == end[1, "F0"]["end"]
    assert end[0, "F0.1"]["start"] == end[1, "F0.1"]["end"] + 10.0          # stage 2 -> 3 crosses ranks


def test_simulate_splits_the_backward_time():
    """t_backward is the whole backward; with W, B takes t_backward - t_weight (default half)."""
    ev = {e["name"]: e["end"] - e["start"] for e in simulate(zbh1_schedule(1, 1), 1.0, 3.0) if e["rank"] == 0}
    assert ev == {"F0": 1.0, "B0": 1.5, "W0": 1.5}
    ev = {e["name"]: e["end"] - e["start"] for e in simulate(zbh1_schedule(1, 1), 1.0, 3.0, t_weight=1.0)}
    assert ev == {"F0": 1.0, "B0": 2.0, "W0": 1.0}
    assert {e["op"] for e in simulate(zbh1_schedule(2, 2))} == {"F", "B", "W"}
    with pytest.raises(ValueError, match="t_weight"):
        simulate(zbh1_schedule(1, 1), 1.0, 1.0, t_weight=2.0)


# ---------------------------------------------------------------- broken schedules are refused
def _refused(schedule, m):
    with pytest.raises(ValueError) as err:
        validate_schedule(schedule, m)
    return str(err.value)


def test_a_deadlock_names_every_blocked_rank():
    s = zbh1_schedule(4, 8)
    s[1] = [F(j) for j in range(5)] + [a for a in s[1] if a.op != "F" or a.microbatch >= 5]   # F4 before B0
    msg = _refused(s, 8)
    assert msg.startswith("the schedule deadlocks: rank 0 at B0 waits for B0 (virtual stage 1) from rank 1; "
                          "rank 1 at F4 waits for F4 (virtual stage 0) from rank 0"), msg
    assert "rank 2 at F4 waits for F4 (virtual stage 1) from rank 1" in msg
    assert "rank 3 at F4 waits for F4 (virtual stage 2) from rank 2" in msg


def test_a_v_order_on_the_looped_placement_deadlocks():
    msg = _refused(Schedule(zbv_schedule(2, 4), placement=[[0, 2], [1, 3]]), 4)
    assert "deadlocks" in msg and "rank 0 at B0.1 waits for B0.1 (virtual stage 3) from rank 1" in msg


def test_a_w_before_its_b_is_refused():
    s = zbh1_schedule(4, 8)
    i, k = s[2].index(B(3)), s[2].index(W(3))
    s[2][i], s[2][k] = s[2][k], s[2][i]
    assert _refused(s, 8) == "invalid pipeline schedule: rank 2: W3 before B3"


def test_a_skipped_microbatch_is_refused():
    s = zbh1_schedule(4, 8)
    s[1] = [a for a in s[1] if a.microbatch != 5]
    assert _refused(s, 8) == "invalid pipeline schedule: rank 1: micro-batch 5 has no F on virtual stage 1"
    s = zbv_schedule(4, 8)
    s[3] = [a for a in s[3] if a != W(6, 1)]
    assert _refused(s, 8) == "invalid pipeline schedule: rank 3: micro-batch 6 has no W on virtual stage 4"


@pytest.mark.parametrize("change, words", [
    (lambda s: s[3].insert(0, s[3].pop(s[3].index(F(0, 1)))),
     "rank 3: F0.1 before F0 (virtual stage 3 feeds 4 on this rank)"),
    (lambda s: s[0].append(F(2)), "rank 0: F2 runs twice; each F, B and W must run exactly once"),
    (lambda s: s.__setitem__(1, [a for a in s[1] if a.op != "W"]), "rank 1: no W actions while rank(s) [0, 2, 3]"),
    (lambda s: s[2].append(Action("X", 0)), "rank 2: unknown action X0"),
    (lambda s: s[0].append(F(9)), "rank 0: F9 is for micro-batch 9, the step has micro-batches 0..7"),
])
def test_other_broken_schedules_name_rank_and_action(change, words):
    s = zbv_schedule(4, 8)
    change(s)
    assert words in _refused(s, 8)


def test_a_bad_placement_is_refused():
    assert "placement [[0], [0]] must give each of the 2 ranks 1 distinct virtual stages" in _refused(
        Schedule([[F(0), B(0)], [F(0), B(0)]], placement=[[0], [0]]), 1)


# ---------------------------------------------------------------- bubble and memory, as the papers state
def test_zbh1_a_third_of_1f1bs_bubble_at_1f1bs_memory():
    """p = 4, m = 8, F = B = W = 1 (a full backward 2). Qi et al. 2024, Sec. 2.3 / Table 2:
    ZB-H1's bubble is (p-1)(T_F + T_B - T_W) per rank, 1F1B's (p-1)(T_F + T_B + T_W)."""
    p, m = 4, 8
    base, zb = validate_schedule(one_f_one_b_schedule(p, m), m), validate_schedule(zbh1_schedule(p, m), m)
    formula = (p - 1) * (1 + 1 - 1) / (m * 3 + (p - 1) * (1 + 1 - 1))      # 3/27
    assert base.bubble == pytest.approx((p - 1) * 3 / (m * 3 + (p - 1) * 3))   # 9/33
    assert zb.bubble <= 0.5 * base.bubble
    assert zb.bubble == pytest.approx(formula, abs=0.05) and zb.bubble == pytest.approx(formula, abs=1e-12)
    assert (base.step_time, zb.step_time) == (33.0, 27.0)
    # memory: whole activations (F until B) per rank exactly 1F1B's p - r; counted until W
    # every rank holds p, 1F1B's rank-0 peak ((p-r)M_B + r·M_W, Sec. 2.3)
    assert zb.peak_until_b == base.peak_in_flight == base.peak_until_b == [4, 3, 2, 1]
    assert zb.peak_in_flight == [4, 4, 4, 4] == [max(base.peak_in_flight)] * p


@pytest.mark.parametrize("p", [2, 3, 4])
@pytest.mark.parametrize("m", [7, 8, 12])
def test_zbh1_idles_p_minus_1_per_rank_for_any_m(p, m):
    report = validate_schedule(zbh1_schedule(p, m), m)
    assert report.step_time == 3 * m + (p - 1)
    assert report.bubble == pytest.approx((p - 1) / (3 * m + p - 1), abs=1e-12)


@pytest.mark.parametrize("p", [2, 3, 4])
@pytest.mark.parametrize("m", [8, 12, 16])
def test_zbv_and_dualpipev_memory_and_bubble(p, m):
    """ZB-V (Qi et al. 2024, Sec. 6, Fig. 8): 1F1B's memory, p·M_B = 2p half-stage chunks,
    on every rank; zero bubble when T_F = T_B = T_W: all that is left on the unit-cost model
    is the ramp of a chunk forward down the V, (p-1)/2 per rank, whatever m. DualPipeV:
    2p+1 chunks (DualPipe's PP+1 with PP = 2p), the same idle time."""
    zbv, dpv = validate_schedule(zbv_schedule(p, m), m), validate_schedule(dualpipev_schedule(p, m), m)
    zbh1 = validate_schedule(zbh1_schedule(p, m), m)
    assert zbv.peak_in_flight == [2 * p] * p and zbv.peak_in_flight[0] / 2 == zbh1.peak_until_b[0] == p
    assert dpv.peak_in_flight == [2 * p + 1] * p
    assert zbv.step_time == dpv.step_time == 3 * m + (p - 1) / 2 < zbh1.step_time
    assert zbv.bubble == pytest.approx((p - 1) / 2 / (3 * m + (p - 1) / 2), abs=1e-12)


def test_zbh1_by_hand():
    """p = 2, m = 3: rank 1 runs each B right after its F and lags its W by one micro-batch."""
    assert zbh1_schedule(2, 3) == [[F(0), F(1), B(0), W(0), F(2), B(1), W(1), B(2), W(2)],
                                   [F(0), B(0), F(1), B(1), W(0), F(2), B(2), W(1), W(2)]]


def test_get_schedule_names_and_bad_counts():
    assert get_schedule("zbh1", 3, 4) == zbh1_schedule(3, 4)
    assert get_schedule("zbv", 3, 4).placement == zbv_schedule(3, 4).placement
    with pytest.raises(ValueError, match=r"^get_schedule: DualPipeV needs at least as many micro-batches as virtual "
                                         r"stages: microbatches\(7\) < 2 x stages\(4\)$"):
        get_schedule("dualpipev", 4, 7)
    with pytest.raises(ValueError, match=r"zbv holds 2 chunks per rank \(V placement\), got chunks=3"):
        get_schedule("zbv", 4, 8, chunks=3)
    with pytest.raises(ValueError, match=r"^dualpipev_schedule: DualPipeV needs"):
        dualpipev_schedule(2, 3)
    with pytest.raises(ValueError, match="microbatches=0"):
        zbh1_schedule(2, 0)


# ---------------------------------------------------------------- torch's orders, action for action
def _torch_order(cls, p, m, chunks):
    """cls's pipeline_order for p ranks, read in our F/B/W: I -> B, full B -> B then W, an
    OVERLAP_F_B pair -> its sub-actions in order; stage -> chunk by the V (or one stage)."""
    stages = [SimpleNamespace(group_size=p, group_rank=0, num_stages=p * chunks, submod=None) for _ in range(chunks)]
    order = cls(stages, m).pipeline_order                  # every rank's, computed without a process group
    out = []
    for r in range(p):
        chunk = {r: 0, 2 * p - 1 - r: 1} if chunks == 2 else {r: 0}
        acts = []
        for a in filter(None, order[r]):
            for sub in a.sub_actions or (a,):
                op, j, c = sub.computation_type.value, sub.microbatch_index, chunk[sub.stage_index]
                acts += [B(j, c), W(j, c)] if op == "B" else [Action({"I": "B"}.get(op, op), j, c)]
        out.append(acts)
    return out


@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("m", [1, 3, 8, 9, 16])
def test_zbv_and_dualpipev_orders_are_torchs(p, m):
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    assert zbv_schedule(p, m) == _torch_order(schedules.ScheduleZBVZeroBubble, p, m, 2)
    if m >= 2 * p:
        assert dualpipev_schedule(p, m) == _torch_order(schedules.ScheduleDualPipeV, p, m, 2)
    if m % max(1, m // p) == 0:                             # torch's ZB1P takes m a multiple of its rounds
        assert zbh1_schedule(p, m) == _torch_order(schedules.ScheduleInterleavedZeroBubble, p, m, 1)


def test_the_torch_comparison_can_fail():
    """The reading of torch's order is not vacuous: a changed order no longer matches."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    theirs = _torch_order(schedules.ScheduleDualPipeV, 2, 4, 2)
    assert sum(len(acts) for acts in theirs) == 2 * 4 * 2 * 3          # every F, B, W of 2 ranks, 2 chunks
    ours = dualpipev_schedule(2, 4)
    ours[0][0], ours[0][1] = ours[0][1], ours[0][0]
    assert ours != theirs


def test_a_schedule_written_as_text_reads_back():
    from ddnb.pipeline_parallel import parse_schedule

    for make, placement in ((zbh1_schedule, "looped"), (zbv_schedule, "v"), (dualpipev_schedule, "v")):
        schedule = make(3, 6)
        text = "# one line per rank\n" + "\n".join(", ".join(map(repr, acts)) for acts in schedule) + "\n\n"
        back = parse_schedule(text, placement)
        assert back == schedule and back.placement == schedule.placement
    assert parse_schedule("f0 b0 w0") == [[F(0), B(0), W(0)]]
    with pytest.raises(ValueError, match=r"rank 1: 'F1\.x' is not an action: write F3, B3 or W3"):
        parse_schedule("F0 B0\nF0 F1.x")
