"""python -m ddnb.bench compress: argument errors before any process starts, and a tiny
real run (2 workers, 3 steps) whose bytes equal the formulas."""
import json

import pytest

from ddnb.bench.__main__ import main
from ddnb.bench.compress import compress_benchmark, compress_table, parse_method
from test_bench import test_argument_errors_before_any_process as check_argument_error   # the same check

KEYS = {"method", "bytes_per_step", "compression_ratio", "step_time", "final_accuracy", "formula_bytes",
        "bytes_match_formula", "total_bytes", "accuracy_drop", "final_loss", "workers"}


@pytest.mark.parametrize("argv, message", [
    (["compress", "--workers", "1"], "need an integer >= 2 workers"),
    (["compress", "--methods", "none,gzip"], "method 'gzip': need one of none, fp16, bf16, powersgd, topk, sign"),
    (["compress", "--methods", "topk:3"], "or powersgd:R with R a rank >= 1"),
    (["compress", "--start", "1"], "need an integer >= 2"),
    (["compress", "--ratio", "0"], "need a number > 0"),
    (["compress", "--ratio", "2"], "--ratio 2.0: need a fraction <= 1"),
    (["compress", "--links", "0,x"], "'0,x': need a comma list of positive GB/s"),
    (["compress", "--links", "1,-2"], "'1,-2': need a comma list of positive GB/s"),
])
def test_argument_errors_before_any_process(argv, message, capsys, monkeypatch):
    check_argument_error(argv, message, capsys, monkeypatch)


def test_bad_arguments_named_before_any_process(monkeypatch):
    monkeypatch.setattr("ddnb.testing.World", None)
    with pytest.raises(ValueError, match=r"workers=1: need an integer >= 2; .*method 'lz4': need one of"):
        compress_benchmark(workers=1, methods=["none", "lz4"])
    assert parse_method("powersgd:4") == ("powersgd", {"rank": 4}) and parse_method("sign") == ("sign", {})


def test_tiny_run(capsys):
    assert main(["compress", "--workers", "2", "--steps", "3", "--start", "2", "--methods",
                 "none,bf16,powersgd:2,topk,sign", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["method"] for r in rows] == ["none", "bf16", "powersgd:2", "topk", "sign"]
    for r in rows:
        assert KEYS <= set(r) and r["bytes_match_formula"] and r["step_time"] > 0
    assert rows[0]["bytes_per_step"] == 4 * 85_002 and rows[1]["compression_ratio"] == 2.0
    assert rows[3]["bytes_per_step"] == 8 * 851                          # k = ceil(1% of 85,002)
    assert "powersgd:2" in compress_table(rows)


def test_plot_accuracy_vs_bytes_draws_one_point_per_row():
    import matplotlib
    matplotlib.use("Agg")
    from ddnb.viz.compression import plot_accuracy_vs_bytes

    rows = [{"method": "none", "bytes_per_step": 340008, "final_accuracy": 0.95},
            {"method": "topk", "bytes_per_step": 6808, "final_accuracy": 0.93}]
    ax = plot_accuracy_vs_bytes(rows)
    assert len(ax.collections) == 2 and [t.get_text() for t in ax.texts] == ["none", "topk"]
    assert ax.get_xscale() == "log" and list(ax.collections[1].get_offsets()[0]) == [6808, 93.0]


def test_the_link_sweep_times_each_method_on_each_emulated_link():
    """Rows per (bandwidth, method) in emulated seconds, none's speedup 1; on a slow link
    top-k (1% of the bytes) beats the plain all-reduce, on a fast one its selection costs
    more than it saves; `pays_below` reads that off the rows."""
    from ddnb.bench.compress_links import link_sweep, pays_below

    rows = link_sweep(["none", "topk"], [1e7, 1e11], workers=2, steps=4, slowdown=50)
    assert [(r["bandwidth"], r["method"]) for r in rows] == [(1e7, "none"), (1e7, "topk"), (1e11, "none"),
                                                             (1e11, "topk")]
    assert all(r["emulated"].startswith("T4s") for r in rows)
    speed = {(r["bandwidth"], r["method"]): r["speedup"] for r in rows}
    assert speed[(1e7, "none")] == speed[(1e11, "none")] == 1.0
    assert speed[(1e7, "topk")] > 2 and speed[(1e11, "topk")] < 1
    assert pays_below(rows) == {"topk": 1e7}
    with pytest.raises(ValueError, match="need 'none'"):
        link_sweep(["topk"], [1e9])


class _WorldCluster:
    """What the widget needs of a Cluster (run), on a ddnb.testing World."""

    def __init__(self, world):
        self.world, self.n = world, world.n

    def run(self, fn, *args):
        return self.world.run(fn, *args)


def test_the_compression_widget_trains_times_and_names_bad_settings(world):
    """Each setting trains on the cluster (bytes per step = the method's formula) and is
    timed beside the plain all-reduce on its emulated link; a bad one is shown, not raised."""
    from ddnb.compression import method_bytes
    from ddnb.compression.train import HIDDEN
    from ddnb.models import mlp
    from ddnb.viz.widgets.compression import CompressionExplorer

    explorer = CompressionExplorer(_WorldCluster(world(2)), steps=6)
    explorer.link.value = "0.1 GB/s"          # each change re-runs: powersgd:4 on 0.1 GB/s
    point = explorer.points[-1]
    shapes = [tuple(p.shape) for p in mlp((64,) + HIDDEN + (10,)).parameters()]
    assert point["method"] == "powersgd:4" and point["bytes_per_step"] == method_bytes("powersgd", [shapes], rank=4)
    assert point["speedup"] > 1 and "emulated" in explorer.status.value and explorer.image.value[:4] == b"\x89PNG"
    explorer.setting = lambda: (_ for _ in ()).throw(ValueError("CompressionExplorer: rank=0: need >= 1"))
    assert explorer.run() is None and explorer.status.value.startswith("ValueError: CompressionExplorer")
