"""Memory through one step, per rank: stacked areas of parameters, gradients, optimizer
state and activations at each event of the step (`ddnb.memory_timeline`).

`plot_memory_timeline` takes plain data, the [(label, index, {part: bytes})] of each rank,
so it draws without a cluster; `ddnb.viz.widgets.memory_timeline.MemoryTimelineWidget`
re-runs the step on the cluster when its strategy or worker count changes. Taught in
`notebooks/11_memory_sharding.ipynb`.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from ddnb._checks import Checks
from ddnb.viz.memory import COLORS, ORDER, UNITS


def plot_memory_timeline(per_rank: list[list[tuple]], title: str | None = None, unit: str = "KB",
                         axes=None):
    """One panel per rank, events on x (their labels as ticks), the four parts stacked on y
    in `unit`, with the same y scale on every panel. Returns the list of Axes."""
    with Checks("plot_memory_timeline") as check:
        check.choice("unit", unit, UNITS)
        check.rule(isinstance(per_rank, (list, tuple)) and len(per_rank) > 0 and all(len(ev) > 0 for ev in per_rank),
                   "per_rank must be a non-empty list of non-empty event lists [(label, index, bytes), ...]")
    n = len(per_rank)
    if axes is None:
        _, axes = plt.subplots(1, n, figsize=(3.3 * n + 0.6, 3.2), sharey=True, squeeze=False)
        axes = list(axes[0])
    scale = UNITS[unit]
    top = max(sum(b.get(k, 0) for k in ORDER) for ev in per_rank for _, _, b in ev) / scale
    for rank, (ax, events) in enumerate(zip(axes, per_rank)):
        xs = list(range(len(events)))
        ys = [[b.get(k, 0) / scale for _, _, b in events] for k in ORDER]
        ax.stackplot(xs, *ys, colors=[COLORS[k] for k in ORDER], labels=list(ORDER), step=None, alpha=0.9)
        ax.set_xticks(xs)
        ax.set_xticklabels([label for label, _, _ in events], rotation=90, fontsize=6)
        ax.set_xlim(0, max(1, len(events) - 1))
        ax.set_ylim(0, 1.1 * top or 1)
        ax.set_title(f"rank {rank}", fontsize=9)
    axes[0].set_ylabel(f"memory ({unit})")
    axes[-1].legend(fontsize=7, loc="upper right")
    if title:
        axes[0].figure.suptitle(title, fontsize=10)
    return axes


def peak_parts(events: list[tuple]) -> dict:
    """The largest value each part reaches over one rank's events, and the largest total."""
    out = {k: max(b.get(k, 0) for _, _, b in events) for k in ORDER}
    out["total"] = max(sum(b.get(k, 0) for k in ORDER) for _, _, b in events)
    return out
