"""The planner widget (notebook 16): each control re-plans with `ddnb.cost.planner.plan`, the
best layout it shows is the plan's first that fits, memory drives it, and bad input is a
status message, never a traceback."""
import matplotlib

matplotlib.use("Agg")

from ddnb.cost.planner import best, plan  # noqa: E402
from ddnb.viz.plan_explorer import PlanExplorer, plot_plan, short_layout  # noqa: E402

MODEL = dict(n_layers=8, d_model=1024, n_heads=16, vocab_size=51200, seq_len=1024)


def test_the_widget_shows_the_plans_best_layout_and_follows_its_controls():
    ex = PlanExplorer(**MODEL, profile="ib", workers=16, memory_gb=80, global_batch=64)
    assert ex.rows == plan(MODEL, "ib", 16, 80e9, 64) and ex.image.value
    assert ex.best == best(ex.rows) and ex.best["layout"] in ex.status.value
    assert "dropped" in ex.table.value or sum(r["fits"] for r in ex.rows) == len(ex.rows)
    roomy = ex.best
    tight = ex.update(memory_gb=0.5)                      # less memory: a layout that shards more
    assert tight == plan(MODEL, "ib", 16, 0.5e9, 64)
    assert roomy["memory"] > 0.5e9 >= ex.best["memory"] and ex.best["layout"] != roomy["layout"]
    assert ex.best["step_time"] >= roomy["step_time"]     # the roomy best did not fit: it was faster
    ex.controls["profile"].value = "10gbe"                # as if the dropdown moved
    assert ex.rows == plan(MODEL, "10gbe", 16, 0.5e9, 64)


def test_no_fit_and_bad_input_are_messages():
    ex = PlanExplorer(**MODEL, workers=2, memory_gb=80, global_batch=64)
    assert ex.update(memory_gb=1e-6) is not None and ex.best is None and "no layout" in ex.status.value
    assert ex.update(memory_gb=-1) is None and "memory_per_worker" in ex.status.value and ex.rows is None
    assert ex.update(colour=1) is None and "colour" in ex.status.value


def test_plot_plan_draws_one_bar_per_layout_that_fits():
    rows = plan(MODEL, "ib", 16, 80e9, 64)
    ax = plot_plan(rows, top=4)
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == [short_layout(r) for r in rows if r["fits"]][:4][::-1]
    assert short_layout(rows[0]).startswith(f"dp{rows[0]['dp']} pp{rows[0]['pp']}")
