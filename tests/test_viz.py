"""Plots and widgets draw from plain data, without a cluster."""
import matplotlib

matplotlib.use("Agg")

import pytest

from ddnb.viz import (AllreduceAnimation, allreduce_steps, plot_allreduce_steps, plot_buffers,
                      plot_time_vs_workers, plot_timeline)
from test_trace import sample_events


@pytest.mark.parametrize("algorithm", ["naive", "tree", "ring", "halving_doubling"])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 8])
def test_allreduce_steps_end_fully_reduced(algorithm, n):
    steps = allreduce_steps(algorithm, n)
    everyone = frozenset(range(n))
    assert all(held == frozenset([r]) for r, row in enumerate(steps[0]["state"]) for held in row)
    assert all(held == everyone for row in steps[-1]["state"] for held in row)
    folds = 2 if n & (n - 1) else 0          # fold and unfold when n is not a power of two
    expected = {"ring": 2 * (n - 1), "naive": 2 * (n - 1), "tree": 2 * (n - 1).bit_length(),
                "halving_doubling": 0 if n == 1 else 2 * (n.bit_length() - 1) + folds}[algorithm]
    assert len(steps) - 1 == expected


def test_ring_moves_one_chunk_per_rank_per_step():
    for step in allreduce_steps("ring", 5)[1:]:
        assert sorted(src for src, _, _ in step["messages"]) == list(range(5))
        assert all(len(chunks) == 1 and dst == (src + 1) % 5 for src, dst, chunks in step["messages"])


def test_bad_algorithm():
    with pytest.raises(ValueError, match="not one of"):
        allreduce_steps("butterfly", 4)


def test_plots_draw():
    ax = plot_timeline(sample_events(), label_bytes=True)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0", "rank 1"]
    assert len(ax.patches) >= 5
    axes = plot_buffers([[1, 2], [3, 4]], [[4, 6], [4, 6]], title="all-reduce")
    assert len(axes) == 2
    fig = plot_allreduce_steps("ring", 4)
    assert "6 steps" in fig._suptitle.get_text()
    ax = plot_time_vs_workers({1: 0.001, 2: 0.002})
    assert list(ax.get_xticks()) == [1, 2]


def test_animation_widget_steps():
    anim = AllreduceAnimation("ring", 4)
    assert anim.step.max == 6
    anim.algorithm.value = "naive"
    anim.n.value = 3
    assert anim.step.max == 4 and len(anim.steps) == 5


def test_ring_reduce_scatter_leaves_chunk_r_on_rank_r():
    """The animation follows ddnb.collectives.ring's schedule."""
    n = 5
    steps = allreduce_steps("ring", n)
    after_rs = steps[n - 1]["state"]
    assert all(after_rs[r][r] == frozenset(range(n)) for r in range(n))


def test_widgets_draw_into_an_image_not_the_cell():
    anim = AllreduceAnimation("tree", 4)
    first = bytes(anim.image.value)
    assert first.startswith(b"\x89PNG")
    anim.step.value = 2
    assert bytes(anim.image.value) != first


def test_parameter_server_plots_draw_from_plain_results():
    from ddnb.viz.parameter_server import applied, plot_convergence, plot_staleness, plot_traffic, server_history

    server = {"role": "server", "history": [{"time": 0.1, "version": 1, "loss": 2.0}, {"time": 0.2, "version": 2, "loss": 1.0}],
              "applied": [{"worker": 1, "staleness": 0}, {"worker": 2, "staleness": 2}]}
    runs = {"asp": [server, {"role": "worker"}]}
    assert server_history(runs["asp"])[1]["loss"] == 1.0
    assert [a["staleness"] for a in applied(runs["asp"])] == [0, 2]
    axes = plot_convergence(runs)
    assert len(axes[0].lines) == 1 and list(axes[1].lines[0].get_xdata()) == [1, 2]
    ax = plot_staleness(runs)
    assert [round(p.get_height(), 2) for p in ax.patches] == [0.5, 0.0, 0.5]
    ax = plot_traffic({"sent": [4 << 20, 1 << 20], "received": [4 << 20, 1 << 20]}, steps=2, servers=1)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["server\nrank 0", "worker\nrank 1"]
    assert sorted(p.get_height() for p in ax.patches) == [0.5, 0.5, 2.0, 2.0]


def test_parameter_server_explorer_draws_what_its_run_fn_returns():
    """The widget trains nothing itself: Run passes its knobs to run_fn and draws the
    per-rank dicts it returns; a failed run is shown in the status, not raised."""
    from ddnb.viz.widgets.parameter_server import ParameterServerExplorer

    server = {"role": "server", "history": [{"time": 0.1, "version": 1, "loss": 2.0}],
              "applied": [{"worker": 1, "staleness": 1}]}
    calls = []

    def run_fn(**knobs):
        calls.append(knobs)
        return [server, {"role": "worker"}]

    explorer = ParameterServerExplorer(run_fn, max_workers=3, steps=20)
    explorer.mode.value, explorer.delay.value = "ssp", 0.01
    assert explorer.run() == [server, {"role": "worker"}]
    assert calls == [{"workers": 3, "servers": 1, "mode": "ssp", "staleness": 2, "straggler_delay": 0.01, "steps": 20}]
    assert explorer.status.value == "done: ssp(2), 3 workers, 1 server, straggler 10 ms"
    assert bytes(explorer.image.value).startswith(b"\x89PNG")

    def fails(**knobs):
        raise ValueError("invalid PSConfig for world_size=4: servers=3 ...\nsecond line")

    explorer.run_fn, explorer.mode.value = fails, "asp"
    assert explorer.run() is None
    assert explorer.status.value == "ValueError: invalid PSConfig for world_size=4: servers=3 ..."
    assert list(explorer.runs) == ["ssp(2), 3 workers, 1 server, straggler 10 ms"]


def test_scaling_table_speedup_and_efficiency():
    from ddnb.viz import scaling_table

    rows = scaling_table({4: 1.0, 1: 2.0, 2: 1.0})
    assert [(r["workers"], r["speedup"], r["efficiency"]) for r in rows] == [(1, 1.0, 1.0), (2, 2.0, 1.0), (4, 2.0, 0.5)]
    assert scaling_table({2: 1.0})[0]["efficiency"] is None          # no 1-worker baseline yet
    with pytest.raises(ValueError, match="worker counts must be integers >= 1"):
        scaling_table({0: 1.0})
    with pytest.raises(ValueError, match=r"times\[1\]=0.0: need a number > 0 \(seconds\)"):
        scaling_table({1: 0.0})
    with pytest.raises(ValueError, match=r"worker counts must be integers >= 1, got \[0, 2\]; times\[2\]=-1: need"):
        scaling_table({0: 1.0, 2: -1})


def test_worker_count_explorer_draws_efficiency_from_a_fake_cluster():
    import matplotlib.pyplot as plt

    from ddnb.viz import WorkerCountExplorer, plot_scaling

    class FakeCluster:
        n = 2

        def resize(self, n):
            if n > 3:
                raise ValueError("only 3 engines here")
            self.n = n

    explorer = WorkerCountExplorer(FakeCluster(), lambda c: 1.0 / c.n + 0.1, max_workers=4, efficiency=True)
    assert explorer.sweep([1, 2, 3]) == pytest.approx({1: 1.1, 2: 0.6, 3: 1 / 3 + 0.1})
    first = bytes(explorer.image.value)
    assert first.startswith(b"\x89PNG")
    explorer.slider.value = 4                       # an error shows in the widget, never raises
    assert explorer.status.value == "4 workers: ValueError: only 3 engines here" and 4 not in explorer.times
    axes = plot_scaling(explorer.times)
    assert [round(y, 3) for y in axes[1].lines[1].get_ydata()] == [1.0, round(1.1 / 1.2, 3), round(1.1 / 1.3, 3)]
    assert axes[1].get_ylim() == (0, 1.2)
    superlinear = plot_scaling({1: 4.0, 2: 1.0})    # efficiency 2: drawn on the chart, not clipped
    assert superlinear[1].get_ylim()[1] == pytest.approx(2.2)
    plt.close("all")


def test_profile_picker_named_custom_and_callbacks():
    from ddnb.emulate import PROFILES
    from ddnb.viz import ProfilePicker

    picker = ProfilePicker("10gbe", slowdown=300)
    assert picker.profile == PROFILES["10gbe"].with_(slowdown=300.0)
    seen = []
    picker.on_change(seen.append)
    picker.menu.value = "InfiniBand HDR + NVLink (DGX A100)"
    assert picker.profile == PROFILES["ib"] and seen[-1] is picker.profile
    assert picker.bandwidth.value == pytest.approx(25.0)           # the inter-host link, GB/s
    picker.bandwidth.value = 1.0                                    # a slider makes it custom
    p = picker.profile
    assert picker.menu.value == "custom" and p.name == "custom"
    assert p.inter.bandwidth == pytest.approx(1e9) and p.inter.alpha == pytest.approx(PROFILES["ib"].inter.alpha)
    assert p.peak_flops == pytest.approx(PROFILES["ib"].peak_flops) and seen[-1] is p
    assert "custom" in picker.status.value
    with pytest.raises(ValueError, match="not a profile"):
        ProfilePicker("infiniband")


def test_pipeline_drawings_show_w_in_its_own_colour_with_a_legend():
    from matplotlib.colors import to_hex

    from ddnb.pipeline_parallel import one_f_one_b_schedule, simulate, zbh1_schedule, zbv_schedule
    from ddnb.viz import plot_pipeline, plot_schedule, plot_schedules
    from ddnb.viz.pipeline import COLORS

    ax = plot_schedule(zbh1_schedule(4, 8))                          # (p-1)/(3m+p-1) = 1/9 on paper
    assert "bubble 0.111" in ax.get_title() and len(ax.patches) == 3 * 4 * 8
    assert {to_hex(b.get_facecolor()) for b in ax.patches} == {COLORS["F"], COLORS["B"], COLORS["W"]}
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "forward", "backward (input gradient)", "weight gradient"]
    ax = plot_pipeline(simulate(one_f_one_b_schedule(4, 8)), unit=None)   # no W: as before
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["forward", "backward"]
    ax = plot_schedule(zbv_schedule(2, 4))                           # the V: two chunks, W in both
    assert len(ax.get_legend().get_texts()) == 6 and len(ax.patches) == 3 * 2 * 4 * 2
    fig = plot_schedules({"1F1B": one_f_one_b_schedule(4, 8), "ZB-H1": zbh1_schedule(4, 8)})
    assert [ax.get_title() for ax in fig.axes] == ["1F1B: bubble 0.273", "ZB-H1: bubble 0.111"]
    assert fig.axes[0].get_xlim() == fig.axes[1].get_xlim()             # one time axis: 33 units against 27


def test_the_schedule_editor_checks_and_redraws_each_edit():
    from ddnb.pipeline_parallel import zbh1_schedule, zbv_schedule
    from ddnb.viz import ScheduleEditor
    from ddnb.viz.schedule_editor import schedule_text

    ed = ScheduleEditor(zbh1_schedule(4, 8))
    assert ed.m.value == 8 and ed.placement.value == "looped"
    assert ed.status.value.startswith("✓ valid for m=8 on 4 ranks") and "bubble 0.111" in ed.status.value
    assert "[4, 4, 4, 4]" in ed.status.value and ed.image.value[:4] == b"\x89PNG"
    lines = ed.text.value.splitlines()
    lines[2] = lines[2].replace(" W3", "").replace("B3", "W3 B3")
    ed.text.value = "\n".join(lines)                                  # W3 before B3 on rank 2
    assert ed.status.value == "✗ invalid pipeline schedule: rank 2: W3 before B3"
    assert ed.report is None and ed.image.value == b""
    ed.text.value = "F0 B0\nB0 F0"
    assert "rank 1: B0 before F0" in ed.status.value
    ed.text.value = "F0 X0\nF0 B0"
    assert "rank 0: 'X0' is not an action" in ed.status.value
    v = ScheduleEditor(zbv_schedule(2, 4))                           # the V read back with its placement
    assert v.placement.value == "v" and v.status.value.startswith("✓") and v.text.value == schedule_text(
        zbv_schedule(2, 4))
    v.placement.value = "looped"
    assert v.status.value.startswith("✗")
