"""Who holds which shard: a grid of cells (rows: e.g. heads or experts; columns: sequence
positions or tokens), each coloured by the rank that holds it, drawn side by side for
"before" and "after" a collective. Plain data in, a matplotlib figure out. Taught in
`notebooks/13_sequence_context_expert.ipynb`.

    plot_ownership({"sequence shards": owner_a, "head shards": owner_b}, xlabel="position", ylabel="head")
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap


def plot_ownership(panels: dict, xlabel: str = "position", ylabel: str = "head", ranks: int | None = None):
    """panels: {title: owner grid (rows × columns of ranks, -1 for nobody)}. One panel per
    entry, cells coloured and labelled by their rank. Returns the figure."""
    grids = {title: np.asarray(grid) for title, grid in panels.items()}
    n = ranks or int(max(g.max() for g in grids.values())) + 1
    colours = ListedColormap(["#eeeeee"] + [plt.cm.tab10(i % 10) for i in range(n)])
    fig, axes = plt.subplots(1, len(grids), figsize=(4.2 * len(grids), 2.6), squeeze=False)
    for ax, (title, grid) in zip(axes[0], grids.items()):
        ax.imshow(grid + 1, cmap=colours, vmin=0, vmax=n, aspect="auto")
        for (i, j), r in np.ndenumerate(grid):
            if r >= 0 and grid.size <= 256:
                ax.text(j, i, str(r), ha="center", va="center", fontsize=7)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.tight_layout()
    return fig
