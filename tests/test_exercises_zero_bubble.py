"""check_zbh1 (chapter 09b): the learner's ZB-H1 is proven by the static checker, priced on
the unit-cost model and run on 4 real processes. It accepts the solution (the gradients of
one process), answers the learner's stub with one line, refuses ddnb's own generators (by
name, and switched off while the learner's function runs), and rejects the usual mistakes
with their hints: 1F1B without W; the split with each W right after its B (a bubble
between 1F1B's and ZB-H1's, naming the rank that idles); a GPipe-like order (too many
micro-batches held); a W before its B."""
import pytest

from ddnb.exercises import check_zbh1 as wrapped_check
from ddnb.exercises.solutions.zero_bubble import my_zbh1
from ddnb.exercises.zero_bubble import check_zbh1
from ddnb.pipeline_parallel import one_f_one_b_schedule


def split_in_place(stages, microbatches):      # the split alone: every W right after its B
    return [[x for a in acts for x in ([repr(a), f"W{a.microbatch}"] if a.op == "B" else [repr(a)])]
            for acts in one_f_one_b_schedule(stages, microbatches)]


def calls_the_library(stages, microbatches):
    from ddnb.pipeline_parallel import zbh1_schedule

    return zbh1_schedule(stages, microbatches)


def test_accepts_the_solution_and_runs_it_with_one_process_gradients():
    msg = check_zbh1(my_zbh1)
    assert msg.startswith("✓ check_zbh1") and "gradients equal to one process's" in msg
    assert "0.111 (m = 8)" in msg


def test_stub_is_not_attempted():
    def my_zbh1(stages, microbatches):
        raise NotImplementedError("Exercise 09b.1: write my_zbh1")

    assert "not attempted yet" in wrapped_check(my_zbh1, exercise="09b.1")


def test_refuses_the_library_by_name_and_while_running():
    with pytest.raises(AssertionError, match=r"calls_the_library uses zbh1_schedule, ddnb's own schedules"):
        check_zbh1(calls_the_library, run=False)
    import ddnb.pipeline_parallel as pp

    hidden = lambda p, m: getattr(pp, "zbh1" + "_schedule")(p, m)   # noqa: E731  (no name to read)
    with pytest.raises(AssertionError, match=r"ddnb's zbh1_schedule is off in this exercise"):
        check_zbh1(hidden, run=False)
    assert pp.zbh1_schedule(4, 4) == pp.get_schedule("zbh1", 4, 4)    # put back afterwards


def test_rejects_1f1b_without_w_and_the_split_left_in_place():
    with pytest.raises(AssertionError, match=r"no W actions: split each backward"):
        check_zbh1(lambda p, m: [[repr(a) for a in acts] for acts in one_f_one_b_schedule(p, m)], run=False)
    with pytest.raises(AssertionError, match=r"m = 4: the bubble on paper \(F = B = W = 1\) is 0\.333, ZB-H1's "
                                             r"0\.200: rank 0 idles 6 units, ZB-H1's rank 0 3\. Hint: a W waits"):
        check_zbh1(split_in_place, run=False)


def test_rejects_too_many_in_flight_and_a_w_before_its_b():
    def gpipe_split(p, m):
        return [[f"F{j}" for j in range(m)] + [f"B{j}" for j in range(m)] + [f"W{j}" for j in range(m)]
                for _ in range(p)]

    with pytest.raises(AssertionError, match=r"m = 4: rank 1 holds 4 micro-batches' whole activations at once "
                                             r"\(F until B\), 1F1B and ZB-H1 at most 3"):
        check_zbh1(gpipe_split, run=False)

    def w_first(p, m):
        s = my_zbh1(p, m)
        s[2] = ["W0"] + [a for a in s[2] if a != "W0"]
        return s

    with pytest.raises(AssertionError, match=r"rank 2: W0 before B0"):
        check_zbh1(w_first, run=False)
