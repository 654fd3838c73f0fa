"""ddnb.throughput: the measurements return well-formed rows (never timed asserts: the
machine is shared), the generated dataset is the same whatever the number of workers,
and bad sizes are rejected; the single-device plots and the memory calculator draw
from plain data and report bad input in the widget."""
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from ddnb.cost import training_memory  # noqa: E402
from ddnb.cost.published import model_table  # noqa: E402
from ddnb.models import GPTConfig  # noqa: E402
from ddnb.throughput import (PreprocessedImages, loader_throughput, matmul_flops_per_second,  # noqa: E402
                             overlapped_epoch, preprocess, step_throughput)
from ddnb.viz import (MemoryCalculator, plot_loader_throughput, plot_model_growth, plot_step_throughput,  # noqa: E402
                      plot_training_days, plot_training_memory)


def test_matmul_peak_and_step_rows():
    assert matmul_flops_per_second(n=64, repeats=2) > 0
    cfg = GPTConfig(n_layers=1, d_model=16, n_heads=2, seq_len=8)
    rows = step_throughput(cfg, [1, 2], steps=1)
    assert [r["batch_size"] for r in rows] == [1, 2]
    for r in rows:
        assert r["step_s"] > 0 and r["tokens_per_s"] == pytest.approx(r["batch_size"] * 8 / r["step_s"])
        assert r["flops_per_s"] > r["tokens_per_s"]


def test_dataset_is_deterministic_and_the_same_with_workers():
    ds = PreprocessedImages(8, shape=(3, 8, 8), work=2, seed=1)
    x, y = ds[3]
    assert x.shape == (3, 8, 8) and x.dtype == torch.float32 and y == 3
    assert torch.equal(ds[3][0], x)
    assert abs(x.mean().item()) < 1e-5                        # standardized
    a = torch.cat([b for b, _ in DataLoader(ds, batch_size=4, num_workers=0)])
    b = torch.cat([b for b, _ in DataLoader(ds, batch_size=4, num_workers=2)])
    assert torch.equal(a, b)
    assert preprocess(torch.zeros(1, 4, 4, dtype=torch.uint8), 1).abs().max() == 0


def test_loader_and_overlap_rows():
    ds = PreprocessedImages(8, shape=(1, 8, 8), work=1)
    r = loader_throughput(ds, num_workers=1, batch_size=4)
    assert r["num_workers"] == 1 and r["samples_per_s"] > 0
    assert 0 < r["first_batch_s"] <= r["seconds"]
    slow = PreprocessedImages(8, shape=(1, 8, 8), work=1, read_s=0.001)
    assert torch.equal(slow[5][0], ds[5][0])                   # reading slower changes no sample
    o = overlapped_epoch(slow, 0.001, num_workers=0, batch_size=4)
    assert o["batches"] == 2 and o["seconds"] >= 8 * 0.001 + 2 * 0.001
    assert o["first_batch_s"] + o["after_first_s"] == pytest.approx(o["seconds"])


@pytest.mark.parametrize("call, names", [
    (lambda: PreprocessedImages(0), ["n=0"]),
    (lambda: PreprocessedImages(4, read_s=-1), ["read_s=-1"]),
    (lambda: loader_throughput(PreprocessedImages(2), num_workers=-1), ["num_workers=-1"]),
    (lambda: overlapped_epoch(PreprocessedImages(2), -1.0), ["compute_s=-1.0"]),
    (lambda: step_throughput(GPTConfig(), [4, 0]), ["batch_sizes[1]=0"]),
    (lambda: matmul_flops_per_second(n=0), ["n=0"]),
    (lambda: overlapped_epoch(PreprocessedImages(2), math.nan, num_workers=-1, batch_size=0),
     ["compute_s=nan", "num_workers=-1", "batch_size=0"]),
])
def test_bad_input(call, names):
    with pytest.raises(ValueError) as err:
        call()
    for name in names:
        assert name in str(err.value)


def test_plots_draw_from_plain_data():
    axes = plot_model_growth(model_table())
    assert len(axes) == 3 and all(ax.get_yscale() == "log" for ax in axes)
    plot_step_throughput([{"batch_size": 1, "tokens_per_s": 10.0, "flops_per_s": 1e6},
                          {"batch_size": 4, "tokens_per_s": 30.0, "flops_per_s": 3e6}], peak_flops=1e8)
    plot_loader_throughput([{"num_workers": 0, "samples_per_s": 5.0}, {"num_workers": 2, "samples_per_s": 9.0}])
    ax = plot_training_days({"E = 1": {1: 100.0, 8: 12.5}})
    assert ax.get_xscale() == "log"
    ax = plot_training_memory(training_memory(2, 64, 4, 100, 32, 2), budget_gb=1e-3)
    assert ax.get_ylim()[1] > 0
    plt.close("all")
    with pytest.raises(ValueError, match="empty"):
        plot_model_growth([])


def test_memory_calculator_reports_errors_in_the_widget():
    calc = MemoryCalculator(n_layers=2, d_model=64, n_heads=4, vocab_size=100, seq_len=32, batch_size=2,
                            budget_gb=1.0)
    assert calc.memory == training_memory(2, 64, 4, 100, 32, 2) and calc.image.value
    assert "fits in 1 GB" in calc.status.value
    assert calc.update(d_model=60, n_heads=8) is None          # 60 % 8 != 0: no traceback, a message
    assert "d_model(60)" in calc.status.value and calc.memory is None
    assert calc.update(d_model=-3) is None and "d_model=-3" in calc.status.value
    assert calc.update(budget_gb=0) is None and "budget_gb=0" in calc.status.value
    assert calc.update(colour=1) is None and "colour" in calc.status.value
    mem = calc.update(d_model=64, n_heads=4, budget_gb=80.0, batch_size=4)
    assert mem == training_memory(2, 64, 4, 100, 32, 4)
    calc.controls["batch_size"].value = 8                       # as if the slider moved
    assert calc.memory == training_memory(2, 64, 4, 100, 32, 8)
