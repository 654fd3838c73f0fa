"""without_overruns: a run that overran is run again at a higher slowdown, saying so; one that
overran every time is refused (refuse=True) or returned under a warning that its times are
wrong."""
import pytest

from ddnb.emulate import get_profile, overruns, summary, without_overruns


def report(overran: int) -> dict:
    return {"rank": 0, "profile": "ib", "syncs": 10, "overruns": overran, "max_overrun": 1e-4 * overran}


def test_overruns_reads_the_summary_lines_it_is_given():
    assert overruns(summary([report(3), report(2)])) == 5
    assert overruns(summary([report(0)])) == 0
    assert overruns([{"emulation": summary([report(4)])}, {"emulation": summary([report(0)])}]) == 4


def test_a_run_that_overran_is_run_again_slower_and_the_first_clean_one_returned():
    seen, said = [], []

    def run(profile):
        seen.append(profile.slowdown)
        return {"emulation": summary([report(7 if profile.slowdown < 400 else 0)]), "slowdown": profile.slowdown}

    out = without_overruns(run, get_profile("ib").with_(slowdown=100), emulation=lambda o: o["emulation"],
                           say=said.append)
    assert seen == [100, 200, 400] and out["slowdown"] == 400
    assert said == ["7 overruns at slowdown 100x (real work outran its model): running again at 200x",
                    "7 overruns at slowdown 200x (real work outran its model): running again at 400x"]


def test_a_number_slowdown_is_raised_too_and_a_run_that_always_overran_is_refused():
    seen = []

    def run(slowdown):
        seen.append(slowdown)
        return [summary([report(1)]), summary([report(0)])]

    with pytest.raises(RuntimeError, match=r"every run overran \(1 at 50x, 1 at 150x\)"):
        without_overruns(run, 50.0, factor=3, tries=2, say=lambda s: None, refuse=True)
    assert seen == [50.0, 150.0]
    said = []
    out = without_overruns(run, 50.0, factor=3, tries=2, say=said.append)
    assert out == run(150.0) and len(said) == 2
    assert said[-1].startswith("WARNING: every run overran (1 at 50x, 1 at 150x)") and "WRONG" in said[-1]
    with pytest.raises(ValueError, match="factor"):
        without_overruns(run, 50.0, factor=1.0)


def test_a_warm_up_step_leaves_its_overruns_out_and_keeps_the_clock():
    import time

    from ddnb.emulate import Emulator
    em = Emulator(get_profile("ib").with_(slowdown=1.0), rank=0, world_size=2, epoch=time.monotonic() - 10.0)
    em.threaded = True                         # a second thread moves this clock: a lag is an overrun
    em.t = 1.0                                 # 9 s behind real time: the next sync overruns
    with em.warm_up():
        em.sync()
        assert em.overruns == em.lags == 1
    assert (em.overruns, em.lags, em.syncs, em.max_overrun) == (0, 0, 0, 0.0) and em.t > 9.0   # the clock went on
    em.t = 1.0
    em.sync()                                  # outside a warm-up it counts
    assert em.overruns == 1 and em.syncs == 1
