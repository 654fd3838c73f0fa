"""Per-rank memory as stacked bars: parameters, gradients, optimizer state, activations.
Takes plain dicts of bytes, one per rank (what `ddnb.memory.model_memory` returns, with
"activations" from the `peak` of a `ddnb.memory.SavedActivations` added), so it draws without a cluster.
Used from `notebooks/08_model_parallelism.ipynb` on."""
from __future__ import annotations

import matplotlib.pyplot as plt

from ddnb._checks import Checks

ORDER = ("parameters", "gradients", "optimizer", "activations")
COLORS = {"parameters": "#4c72b0", "gradients": "#dd8452", "optimizer": "#55a868", "activations": "#c44e52"}
UNITS = {"B": 1, "KB": 2**10, "MB": 2**20, "GB": 2**30}   # binary multiples: every byte axis and label of ddnb.viz


def fmt_bytes(n: float) -> str:
    """A short label in binary units: 512 -> "512B", 4096 -> "4KB", 3 << 20 -> "3MB"."""
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024:
            return f"{n:.0f}{unit}"
        n /= 1024
    return f"{n:.0f}TB"


def plot_memory(per_rank: list[dict[str, int]], title: str | None = None, ax=None, unit: str = "MB",
                labels: list[str] | None = None):
    """One bar per rank (or per entry of `labels`, e.g. "1 process"), stacked by part:
    parameters, gradients, optimizer, activations first, then any other keys in the order
    they first appear. Values are bytes, drawn in `unit`, with each bar's total on top.
    Returns the Axes."""
    with Checks("plot_memory") as check:
        check.choice("unit", unit, UNITS)
        check.rule(labels is None or len(labels) == len(per_rank), f"{len(labels or ())} labels for "
                   f"{len(per_rank)} bars")
    keys = [k for k in ORDER if any(k in d for d in per_rank)]
    for d in per_rank:
        keys += [k for k in d if k not in keys]
    if ax is None:
        _, ax = plt.subplots(figsize=(1.8 + 1.1 * max(1, len(per_rank)), 3.4))
    scale = UNITS[unit]
    xs = list(range(len(per_rank)))
    bottom = [0.0] * len(per_rank)
    for i, k in enumerate(keys):
        vals = [d.get(k, 0) / scale for d in per_rank]
        ax.bar(xs, vals, bottom=bottom, color=COLORS.get(k, f"C{4 + i}"), label=k, width=0.6)
        bottom = [b + v for b, v in zip(bottom, vals)]
    for x, total in zip(xs, bottom):
        ax.text(x, total, f"{total:.2f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(xs)
    ax.set_xticklabels(labels if labels is not None else [f"rank {r}" for r in xs])
    ax.set_ylabel(f"memory ({unit})")
    ax.set_ylim(0, 1.15 * max(bottom, default=0) or 1)
    if keys:
        ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    return ax
