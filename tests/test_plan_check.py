"""The planner falsified (`ddnb.bench.plan_check`, notebook 16): Spearman's rho as the
Pearson correlation of ranks with ties averaged (against scipy), the layouts chosen are the
planner's fastest runnable ones and some from below its median, a small emulated run
measures each chosen layout with no overruns and ranks it, and the command line refuses
what it cannot run before any process starts."""
import subprocess
import sys

import pytest

from ddnb.bench.plan_check import CHECK_BATCH, CHECK_MODEL, choose, plan_check, ranks_of, spearman
from ddnb.cost.planner import plan


def test_ranks_average_ties_and_spearman_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    assert ranks_of([10, 30, 20, 20]) == [1.0, 4.0, 2.5, 2.5]
    a, b = [0.1, 0.4, 0.2, 0.9, 0.5, 0.5], [1, 3, 2, 6, 4, 5]
    assert spearman(a, b) == pytest.approx(stats.spearmanr(a, b).statistic)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    with pytest.raises(ValueError, match="same length"):
        spearman([1, 2], [1])


def test_choose_takes_the_fastest_runnable_and_some_below_the_median():
    from ddnb.grid4d import Layout

    rows = plan(CHECK_MODEL, "ib", 8, 80e9, CHECK_BATCH, precision="fp32", chunks=(1,), checkpointing=(False,))
    chosen = choose(rows, CHECK_MODEL, 8, CHECK_BATCH, top=8, low=4)
    ranks = [k for k, _ in chosen]
    runnable = [r for r in rows if r["fits"] and not Layout.from_plan(r, CHECK_BATCH).problems(CHECK_MODEL, 8,
                                                                                               CHECK_BATCH)]
    assert ranks[:8] == list(range(1, 9)) and len(chosen) == 12
    assert all(len(runnable) // 2 < k <= 3 * len(runnable) // 4 + 1 for k in ranks[8:])
    times = [r["step_time"] for _, r in chosen]
    assert times == sorted(times)                                   # planner order kept


def test_a_small_emulated_check_measures_every_layout_without_overruns():
    rows, summary = plan_check(workers=4, profile="ib", top=3, low=1)
    assert summary["overruns"] == 0 and summary["layouts"] == len(rows) == 4
    assert sorted(r["measured_rank"] for r in rows) == [1, 2, 3, 4]
    for r in rows:
        assert r["measured_step"] > 0 and r["error"] == pytest.approx(r["predicted_step"] / r["measured_step"] - 1)
    assert -1 <= summary["spearman"] <= 1
    assert summary["spearman"] == pytest.approx(spearman([r["predicted_step"] for r in rows],
                                                         [r["measured_step"] for r in rows]))
    assert summary["spearman_textbook"] == pytest.approx(spearman([r["textbook_step"] for r in rows],
                                                                  [r["measured_step"] for r in rows]), nan_ok=True)
    top = [r for r in rows if r["predicted_rank"] <= 3]
    assert summary["top"] == 3 and summary["allreduce"] == "ring"
    assert summary["spearman_top"] == pytest.approx(spearman([r["predicted_step"] for r in top],
                                                             [r["measured_step"] for r in top]), nan_ok=True)


@pytest.mark.parametrize("zero, pp", [(1, 1), (2, 1), (3, 1), (1, 2)])
def test_the_model_counts_the_collectives_zero_runs(zero, pp):
    """The planner's ZeRO traffic is the implementation's: as many reduce-scatters and
    all-gathers per step as a traced run of train_4d calls (rank 0, the last step)."""
    from collections import Counter

    from ddnb.bench.plan_check import grid_check
    from ddnb.cost.layout import model_shape, zero_collectives, zero_units
    from ddnb.grid4d import Layout
    from ddnb.testing import World

    lay = Layout(dp=4 // pp, pp=pp, zero=zero, microbatches=2)
    with World(4, timeout=60) as world:
        row = grid_check(world, [lay])[0]
    counted = Counter(name.split()[0] for name in row["collectives"])
    expected = zero_collectives(zero, zero_units(model_shape(CHECK_MODEL), pp), 2)
    assert {k: counted[k] for k in expected} == expected
    assert row["max_loss_diff"] < 1e-4


@pytest.mark.parametrize("args, message", [
    (["--emulate", "ib"], "--emulate needs --workers"),
    (["--workers", "4", "--emulate", "ib", "--model", "1,2,3,4,5"], "drop --model"),
    (["--paper", "megatron2021", "--slowdown", "3"], "--slowdown needs --emulate"),
])
def test_the_command_line_refuses_before_any_process(args, message):
    out = subprocess.run([sys.executable, "-m", "ddnb.bench", "plan", *args], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and message in out.stderr
