"""The limits of one device, drawn from plain rows: training-step throughput against batch
size, DataLoader throughput against workers, and days of training against devices.
Rows are what `ddnb.throughput` measures and `ddnb.cost.training_days` computes.
Used in `notebooks/01_why_distributed.ipynb`."""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.ticker import PercentFormatter


def plot_step_throughput(rows: list[dict], peak_flops: float | None = None, axes=None):
    """Two panels against batch size (log 2): tokens/s, and the model FLOP/s as a fraction
    of `peak_flops` (MFU; drawn when a peak is given). Rows {batch_size, tokens_per_s,
    flops_per_s}. Returns the axes."""
    if not rows:
        raise ValueError("rows is empty: nothing to plot")
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    bs = [r["batch_size"] for r in rows]
    axes[0].plot(bs, [r["tokens_per_s"] for r in rows], "o-")
    axes[0].set_ylabel("tokens / s")
    axes[0].set_ylim(bottom=0)
    if peak_flops:
        axes[1].plot(bs, [r["flops_per_s"] / peak_flops for r in rows], "o-", color="C1")
        axes[1].set_ylim(bottom=0)
        axes[1].yaxis.set_major_formatter(PercentFormatter(1.0))
    axes[1].set_ylabel("MFU (model FLOP/s / peak)")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(bs)
        ax.set_xticklabels([str(b) for b in bs])
        ax.set_xlabel("batch size")
        ax.grid(alpha=0.3)
    return axes


def plot_loader_throughput(rows: list[dict], ax=None, title: str = ""):
    """Bars of samples/s for each num_workers (rows {num_workers, samples_per_s}). Returns the Axes."""
    if not rows:
        raise ValueError("rows is empty: nothing to plot")
    if ax is None:
        _, ax = plt.subplots(figsize=(4.5, 3.2))
    xs = list(range(len(rows)))
    ax.bar(xs, [r["samples_per_s"] for r in rows], width=0.6)
    ax.set_xticks(xs)
    ax.set_xticklabels([str(r["num_workers"]) for r in rows])
    ax.set_xlabel("DataLoader num_workers")
    ax.set_ylabel("samples / s")
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3, axis="y")
    return ax


def plot_training_days(days: dict[str, dict[int, float]], ax=None, title: str = ""):
    """Days of training against the number of devices, log-log, one line per label
    ({label: {n_devices: days}}, e.g. one per scaling efficiency). Returns the Axes."""
    if not days:
        raise ValueError("days is empty: nothing to plot")
    if ax is None:
        _, ax = plt.subplots(figsize=(5.5, 3.4))
    for label, curve in days.items():
        ns = sorted(curve)
        ax.plot(ns, [curve[n] for n in ns], "o-", label=label, ms=3)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("devices")
    ax.set_ylabel("days")
    for d, name in ((365, "1 year"), (30, "1 month"), (1, "1 day")):
        ax.axhline(d, color="gray", lw=0.7, ls=":")
        ax.text(ax.get_xlim()[0], d, f" {name}", fontsize=7, va="bottom", color="gray")
    if title:
        ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return ax
