"""Pictures of tensor parallelism: which rank owns which part of each weight matrix, and a
slider over the tensor-parallel degree t showing measured per-rank memory and traffic.
Both take plain data (lists of owners, dicts of bytes), so they draw without a cluster.
Used in `notebooks/10_tensor_parallelism.ipynb`."""
from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import display
from matplotlib.colors import ListedColormap

from ddnb.viz.memory import UNITS, plot_memory
from ddnb.viz.png import figure_png


def plot_shard_layout(layouts: dict[str, list[list[int]]], title: str | None = None):
    """One panel per weight matrix: `layouts[name]` is a 2-D list (rows × columns of the
    weight, as stored: out × in) of the rank that holds each entry. Returns the Figure."""
    n = len(layouts)
    if n == 0:
        raise ValueError("layouts is empty: give at least one {name: [[rank, ...], ...]}")
    ranks = 1 + max(v for grid in layouts.values() for row in grid for v in row)
    cmap = ListedColormap([f"C{r}" for r in range(ranks)])
    fig, axes = plt.subplots(1, n, figsize=(2.6 * n, 2.8), squeeze=False)
    for ax, (name, grid) in zip(axes[0], layouts.items()):
        ax.imshow(grid, cmap=cmap, vmin=-0.5, vmax=ranks - 0.5, aspect="auto", interpolation="nearest")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("in features", fontsize=8)
        ax.set_ylabel("out features", fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
    handles = [plt.Rectangle((0, 0), 1, 1, color=f"C{r}") for r in range(ranks)]
    fig.legend(handles, [f"rank {r}" for r in range(ranks)], loc="lower center", ncol=ranks, fontsize=8,
               frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def plot_tp_traffic(per_t: dict[int, dict[str, int]], ax=None, unit: str = "KB"):
    """Bars of bytes communicated per rank for each t: per_t[t] = {"forward": bytes,
    "backward": bytes}. Returns the Axes."""
    scale = UNITS[unit]
    if ax is None:
        _, ax = plt.subplots(figsize=(4.2, 3.0))
    ts = sorted(per_t)
    xs = list(range(len(ts)))
    fwd = [per_t[t].get("forward", 0) / scale for t in ts]
    bwd = [per_t[t].get("backward", 0) / scale for t in ts]
    ax.bar(xs, fwd, width=0.6, label="forward", color="#4c72b0")
    ax.bar(xs, bwd, width=0.6, bottom=fwd, label="backward", color="#dd8452")
    ax.set_xticks(xs)
    ax.set_xticklabels([f"t={t}" for t in ts])
    ax.set_ylabel(f"all-reduced per rank ({unit})")
    ax.legend(fontsize=8)
    return ax


class TensorParallelExplorer:
    """A slider over the tensor-parallel degrees measured in `results` ({t: {"memory":
    [per-rank dict of bytes], "traffic": {"forward": bytes, "backward": bytes}}}): shows
    rank 0 of each t next to t=1, and the traffic of every t, with the selected t marked."""

    def __init__(self, results: dict[int, dict], title: str = ""):
        if not results:
            raise ValueError("results is empty: measure at least one t")
        self.results, self.title = results, title
        ts = sorted(results)
        self.slider = widgets.SelectionSlider(options=ts, value=ts[-1], description="t")
        self.image = widgets.Image(format="png")
        self.label = widgets.Label()
        self.slider.observe(lambda change: self.show(change["new"]), names="value")
        self.widget = widgets.VBox([self.slider, self.label, self.image])
        self.show(ts[-1])

    def show(self, t: int) -> None:
        base, mem = self.results[min(self.results)]["memory"][0], self.results[t]["memory"]
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.2))
        plot_memory([base] + mem, ax=ax1, unit="KB",
                    labels=[f"t={min(self.results)}"] + [f"t={t} r{r}" for r in range(len(mem))])
        plot_tp_traffic({k: v["traffic"] for k, v in self.results.items()}, ax=ax2)
        ax2.axvline(sorted(self.results).index(t), color="k", lw=0.8, ls=":")
        fig.suptitle(self.title or f"tensor-parallel degree t={t}", fontsize=10)
        fig.tight_layout()
        ratio = sum(mem[0].values()) / max(1, sum(base.values()))
        self.label.value = f"t={t}: rank 0 holds {ratio:.2f} of the t=1 memory (1/t = {1 / t:.2f})"
        self.image.value = figure_png(fig)

    def _ipython_display_(self):
        display(self.widget)
