"""ddnb.cost.pipeline: each formula against numbers worked out by hand, against the
schedules themselves (simulated bubble, micro-batches in flight; GPipe, 1F1B,
interleaved 1F1B and ZB-H1), and its validation."""
import pytest

from ddnb.cost import (interleaved_bubble_fraction, model_parallel_idle_fraction, peak_microbatches_in_flight,
                       pipeline_activation_bytes, pipeline_bubble_fraction, pipeline_step_time, zbh1_bubble_fraction)
from ddnb.pipeline_parallel import bubble_fraction, get_schedule, in_flight, simulate


# by hand: p=4, m=8: 3/11; p=4, m=1: 3/4; p=2, m=4: 1/5; p=1: 0
@pytest.mark.parametrize("p, m, expected", [(4, 8, 3 / 11), (4, 1, 0.75), (2, 4, 0.2), (1, 7, 0.0), (8, 32, 7 / 39)])
def test_bubble_fraction_by_hand(p, m, expected):
    assert pipeline_bubble_fraction(p, m) == pytest.approx(expected, rel=1e-12)


def test_naive_model_parallel_is_the_bubble_with_one_microbatch():
    assert [model_parallel_idle_fraction(p) for p in (1, 2, 4)] == [0.0, 0.5, 0.75]
    assert all(model_parallel_idle_fraction(p) == pipeline_bubble_fraction(p, 1) for p in range(1, 9))


def test_step_time_by_hand():
    # p=4, m=8, t_f=1, t_b=2: (8 + 3) * 3 = 33
    assert pipeline_step_time(4, 8, 1.0, 2.0) == 33.0
    assert pipeline_step_time(1, 5, 0.5, 1.0) == 7.5


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("m", [1, 2, 4, 5, 8])
def test_formulas_agree_with_the_simulated_schedules(name, p, m):
    """Equal stages, backward = 2 x forward: the simulated step is (m+p-1)(t_f+t_b) long, its
    bubble is (p-1)/(m+p-1) exactly, and each rank holds the formula's micro-batches."""
    schedule = get_schedule(name, p, m)
    events = simulate(schedule, t_forward=1.0, t_backward=2.0)
    assert max(e["end"] for e in events) == pytest.approx(pipeline_step_time(p, m, 1.0, 2.0))
    assert bubble_fraction(events) == pytest.approx(pipeline_bubble_fraction(p, m), abs=1e-12)
    assert [in_flight(acts) for acts in schedule] == [peak_microbatches_in_flight(name, p, m, r) for r in range(p)]


# by hand: p=4, m=8, v=2: 3/19; v=1 is 1F1B's 3/11; p=2, m=4, v=4: 1/17
@pytest.mark.parametrize("p, m, v, expected", [(4, 8, 2, 3 / 19), (4, 8, 1, 3 / 11), (2, 4, 4, 1 / 17)])
def test_interleaved_bubble_by_hand(p, m, v, expected):
    assert interleaved_bubble_fraction(p, m, v) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("p, m", [(2, 2), (2, 4), (3, 6), (4, 4), (4, 8), (4, 12)])
@pytest.mark.parametrize("v", [1, 2, 3])
def test_interleaved_formulas_agree_with_the_simulated_schedule(p, m, v):
    """Each chunk takes 1/v of a stage's time: the bubble is (p-1)/(vm+p-1), and rank r
    holds 2(p-r-1) + (v-1)p + 1 (chunk, micro-batch) pairs at most (v = 1: 1F1B's p - r)."""
    schedule = get_schedule("interleaved", p, m, v)
    assert bubble_fraction(simulate(schedule)) == pytest.approx(interleaved_bubble_fraction(p, m, v), abs=1e-12)
    assert [in_flight(acts) for acts in schedule] == \
        [peak_microbatches_in_flight("interleaved", p, m, r, chunks=v) for r in range(p)]


@pytest.mark.parametrize("p, m", [(2, 2), (4, 4), (4, 8), (4, 16), (8, 12)])
def test_zbh1_formula_agrees_with_the_simulated_schedule_for_m_at_least_p(p, m):
    """(p-1)/(3m+p-1) with T_F = T_B = T_W (Qi et al. 2024, Table 2): by hand 1/9 for
    p = 4, m = 8; the simulated ZB-H1 gives it exactly once m >= p."""
    assert zbh1_bubble_fraction(4, 8) == pytest.approx(1 / 9)
    assert zbh1_bubble_fraction(p, m) == pytest.approx(bubble_fraction(simulate(get_schedule("zbh1", p, m))))
    # T_W = 0 (nothing to move): 1F1B's bubble with a backward of T_B
    assert zbh1_bubble_fraction(p, m, 1.0, 2.0, 0.0) == pytest.approx(pipeline_bubble_fraction(p, m))


def test_activation_bytes_gpipe_grows_with_m_1f1b_with_p():
    assert pipeline_activation_bytes("gpipe", 4, 16, 1000) == 16000
    assert pipeline_activation_bytes("1f1b", 4, 16, 1000) == 4000           # stage 0: p micro-batches
    assert pipeline_activation_bytes("1f1b", 4, 16, 1000, rank=3) == 1000   # last stage: 1
    assert pipeline_activation_bytes("1f1b", 4, 2, 1000) == 2000            # never more than m


@pytest.mark.parametrize("call, words", [
    (lambda: pipeline_bubble_fraction(0, 4), ["stages=0"]),
    (lambda: pipeline_bubble_fraction(4, 2.5), ["microbatches=2.5"]),
    (lambda: pipeline_bubble_fraction(True, 4), ["stages=True"]),
    (lambda: pipeline_bubble_fraction(-1, 0), ["stages=-1", "microbatches=0"]),
    (lambda: model_parallel_idle_fraction(0), ["stages=0"]),
    (lambda: pipeline_step_time(2, 2, -1.0, 1.0), ["t_forward=-1.0"]),
    (lambda: peak_microbatches_in_flight("zb", 2, 2), ["'zb'", "gpipe", "1f1b"]),
    (lambda: peak_microbatches_in_flight("1f1b", 2, 2, rank=2), ["rank=2", "stages(2)"]),
    (lambda: pipeline_activation_bytes("gpipe", 2, 2, 0), ["bytes_per_microbatch=0"]),
    (lambda: interleaved_bubble_fraction(2, 4, 0), ["chunks=0"]),
    (lambda: zbh1_bubble_fraction(0, 2, t_weight=-1), ["stages=0", "t_weight=-1"]),
    (lambda: pipeline_activation_bytes("zb", 0, 2, -1, rank=-1), ["'zb'", "stages=0", "bytes_per_microbatch=-1",
                                                                   "rank=-1"]),
    (lambda: get_schedule("interleaved", 4, 6, 2), ["microbatches(6) % stages(4) = 2"]),
])
def test_bad_input_names_every_value(call, words):
    with pytest.raises(ValueError) as err:
        call()
    assert all(w in str(err.value) for w in words), str(err.value)
