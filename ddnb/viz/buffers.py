"""Per-rank buffers before and after a collective, drawn as coloured cells: the picture
of what broadcast, scatter, gather, reduce, all-gather, reduce-scatter, all-reduce and
all-to-all do. Values are plain lists (one list of numbers per rank; None = empty);
`plot_collective` titles them with the collective (`ddnb.viz.widgets.collective_explorer`
runs it on the cluster).
Taught in `notebooks/03_collectives.ipynb`.
"""
from __future__ import annotations

import matplotlib.pyplot as plt


def plot_buffers(before: list, after: list, title: str = "", axes=None):
    """Two panels (before, after), one row per rank, one cell per element with its value."""
    if axes is None:
        fig, axes = plt.subplots(1, 2, figsize=(8, 0.5 + 0.45 * len(before)))
    for ax, data, name in zip(axes, (before, after), ("before", "after")):
        _draw(ax, data, name)
    if title:
        axes[0].figure.suptitle(title)
    return axes


def plot_collective(name: str, before: list, after: list, axes=None):
    """Every rank's buffer before and after collective `name` (lists as
    `ddnb.collectives.demo.run_collective` returns them, one per rank, None = nothing of
    interest). Returns the Figure."""
    axes = plot_buffers(before, after, title=f"{name} on {len(before)} ranks", axes=axes)
    return axes[0].figure


def _draw(ax, data, name):
    width = max((len(row) for row in data if row is not None), default=1)
    values = [v for row in data if row is not None for v in row]
    lo, hi = (min(values), max(values)) if values else (0, 1)
    cmap = plt.get_cmap("viridis")
    for r, row in enumerate(data):
        for c in range(width):
            if row is None or c >= len(row):
                ax.add_patch(plt.Rectangle((c, r), 1, 1, fill=False, ec="#cccccc", hatch="//"))
                continue
            v = row[c]
            shade = 0.5 if hi == lo else (v - lo) / (hi - lo)
            ax.add_patch(plt.Rectangle((c, r), 1, 1, color=cmap(0.15 + 0.7 * shade), ec="white"))
            ax.text(c + 0.5, r + 0.5, f"{v:g}", ha="center", va="center", fontsize=8,
                    color="white" if shade < 0.6 else "black")
    ax.set_xlim(0, width)
    ax.set_ylim(len(data), 0)
    ax.set_yticks([r + 0.5 for r in range(len(data))])
    ax.set_yticklabels([f"rank {r}" for r in range(len(data))])
    ax.set_xticks([])
    ax.set_title(name)
    ax.set_aspect("equal")
    for spine in ax.spines.values():
        spine.set_visible(False)
