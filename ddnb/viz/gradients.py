"""Gradient flow in data parallelism, from plain data:

    plot_gradient_heatmap(before, after, layer_names)   rank × layer gradient norms, before
                                                        the all-reduce (every rank its own)
                                                        and after (all equal: the mean)
    GradientFlowExplorer(before, after, layer_names)    a widget: step through iterations,
                                                        pick a layer
    plot_bucket_timeline(events)                        backward and each bucket's all-reduce,
                                                        per rank (BucketedDataParallel's trace)
    plot_horovod_timeline(events)                       Horovod's timeline, one row per tensor

`before`/`after` are lists (one per rank) of lists (one norm per layer), e.g. gathered from
every rank's `model.grad_norm_history[-1]`; `stack_history` turns the per-rank histories
into per-step ones for the explorer. Taught in `notebooks/06_data_parallelism.ipynb` and
`notebooks/07_horovod.ipynb`.
"""
from __future__ import annotations

import math

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import display
from matplotlib.patches import Patch, Rectangle

from ddnb.viz.png import figure_png
from ddnb.viz.timeline import COLORS, plot_timeline


def _log10(values, floor: float) -> list[list[float]]:
    return [[math.log10(max(v, floor)) for v in row] for row in values]


def _check(before, after, layer_names) -> None:
    if not before or len(before) != len(after):
        raise ValueError(f"before and after need one row per rank, the same number: got {len(before)} and {len(after)}")
    widths = {len(row) for row in list(before) + list(after)}
    if widths != {len(layer_names)}:
        raise ValueError(f"every row needs one norm per layer ({len(layer_names)} layer names), got row lengths "
                         f"{sorted(widths)}")


def plot_gradient_heatmap(before, after, layer_names, axes=None, title: str = "", log: bool = True,
                          highlight: int | None = None):
    """Two heatmaps, rank × layer, of gradient norms before and after synchronization,
    on one colour scale (log10 by default). `highlight`: a layer index to outline.
    Returns the two Axes."""
    _check(before, after, layer_names)
    everything = [v for row in list(before) + list(after) for v in row]
    positive = [v for v in everything if v > 0]
    floor = min(positive) if positive else 1e-12
    data = [_log10(before, floor), _log10(after, floor)] if log else [before, after]
    lo, hi = min(min(r) for d in data for r in d), max(max(r) for d in data for r in d)
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(min(16, 4 + 0.5 * len(layer_names)), 1.6 + 0.35 * len(before)),
                               sharey=True, layout="constrained")
    for ax, values, name in zip(axes, data, ("before sync (local)", "after sync (mean over ranks)")):
        im = ax.imshow(values, aspect="auto", cmap="viridis", vmin=lo, vmax=hi if hi > lo else lo + 1)
        ax.set_title(name, fontsize=10)
        ax.set_xticks(range(len(layer_names)))
        ax.set_xticklabels(layer_names, rotation=90, fontsize=7)
        ax.set_yticks(range(len(values)))
        ax.set_yticklabels([f"rank {r}" for r in range(len(values))])
        if highlight is not None:
            ax.add_patch(Rectangle((highlight - 0.5, -0.5), 1, len(values), fill=False, ec="red", lw=2))
    cbar = axes[1].figure.colorbar(im, ax=list(axes), fraction=0.04, pad=0.01)
    cbar.set_label("log10 ‖grad‖" if log else "‖grad‖")
    if title:
        axes[0].figure.suptitle(title)
    return axes


def stack_history(per_rank_history) -> tuple[list, list]:
    """[rank][i] = {"before": [...], "after": [...]} (each rank's `grad_norm_history`) ->
    (before, after), each [step][rank][layer], over the steps every rank recorded."""
    steps = min(len(h) for h in per_rank_history)
    before = [[h[s]["before"] for h in per_rank_history] for s in range(steps)]
    after = [[h[s]["after"] for h in per_rank_history] for s in range(steps)]
    return before, after


class GradientFlowExplorer:
    """Step through iterations (slider) and pick a layer (dropdown): the rank × layer
    heatmaps of that step, the layer outlined, and that layer's norm on each rank before
    and after sync. before/after: [step][rank][layer].

        before, after = stack_history(cluster.run(lambda: model.grad_norm_history))
        GradientFlowExplorer(before, after, model.names)
    """

    def __init__(self, before, after, layer_names, title: str = ""):
        if not before or len(before) != len(after):
            raise ValueError(f"before and after need the same number (>= 1) of steps, got {len(before)} and "
                             f"{len(after)}")
        for b, a in zip(before, after):
            _check(b, a, layer_names)
        self.before, self.after, self.layer_names, self.title = before, after, list(layer_names), title
        self.step = widgets.IntSlider(value=0, min=0, max=len(before) - 1, description="step",
                                      continuous_update=False)
        self.layer = widgets.Dropdown(options=[(n, i) for i, n in enumerate(self.layer_names)], value=0,
                                      description="layer")
        self.image = widgets.Image(format="png")
        self.step.observe(lambda _: self.redraw(), names="value")
        self.layer.observe(lambda _: self.redraw(), names="value")
        self.widget = widgets.VBox([widgets.HBox([self.step, self.layer]), self.image])
        self.redraw()

    def figure(self, step: int, layer: int):
        fig = plt.figure(figsize=(12, 3 + 0.3 * len(self.before[step])), layout="constrained")
        grid = fig.add_gridspec(1, 3, width_ratios=[2, 2, 1.2])
        axes = [fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1])]
        plot_gradient_heatmap(self.before[step], self.after[step], self.layer_names, axes=axes, highlight=layer)
        ax = fig.add_subplot(grid[0, 2])
        ranks = range(len(self.before[step]))
        ax.bar([r - 0.2 for r in ranks], [row[layer] for row in self.before[step]], 0.4, label="before",
               color=COLORS["compute"])
        ax.bar([r + 0.2 for r in ranks], [row[layer] for row in self.after[step]], 0.4, label="after",
               color=COLORS["collective"])
        ax.set_xticks(list(ranks))
        ax.set_xticklabels([f"rank {r}" for r in ranks])
        ax.set_title(f"{self.layer_names[layer]}: ‖grad‖", fontsize=10)
        ax.legend(fontsize=8)
        fig.suptitle(self.title or f"step {step}")
        return fig

    def redraw(self) -> None:
        self.image.value = figure_png(self.figure(self.step.value, self.layer.value))

    def _ipython_display_(self):
        display(self.widget)


def plot_bucket_timeline(events: list[dict], step: int | None = None, ax=None, unit: str = "ms"):
    """BucketedDataParallel's trace of one step (`step`, default the last): per rank, a
    row for backward (compute) and below it the bucket all-reduces, each from launch to
    completion and labelled with its bucket index; the part of an all-reduce left of the
    end of backward is the communication hidden behind it. Returns the Axes."""
    ours = [e for e in events if e.get("step") is not None and
            ((e["kind"] == "compute" and e["name"] == "backward") or (e["kind"] == "collective" and "bucket" in e)
             or (e["kind"] == "wait" and e["name"] == "sync"))]
    if not ours:
        raise ValueError("no BucketedDataParallel events (compute 'backward', collective 'bucket k') in `events`")
    step = max(e["step"] for e in ours) if step is None else step
    ours = [e for e in ours if e["step"] == step]
    ranks = sorted({e["rank"] for e in ours})
    n_buckets = 1 + max((e["bucket"] for e in ours if e["kind"] == "collective"), default=0)
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    t0 = min(e["start"] for e in ours)
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.8 + (0.7 + 0.12 * n_buckets) * len(ranks)), layout="constrained")
    lane = 0.8 / n_buckets                 # the all-reduce row: one lane per bucket, bucket 0 on top
    for e in ours:
        row = ranks.index(e["rank"]) * 2
        left, width = (e["start"] - t0) * scale, max((e["end"] - e["start"]) * scale, 1e-9)
        if e["kind"] == "collective":
            y = row + 1 - 0.4 + lane * (e["bucket"] + 0.5)
            ax.barh(y, width, left=left, height=lane * 0.85, color=COLORS["collective"], edgecolor="none")
            if n_buckets <= 12:
                ax.text(left + width, y, f" b{e['bucket']}", ha="left", va="center", fontsize=6)
        else:
            ax.barh(row, width, left=left, height=0.6, color=COLORS[e["kind"]], edgecolor="none")
    for i, r in enumerate(ranks):   # end of backward: what is left of it is hidden communication
        end = next((e["end"] for e in ours if e["rank"] == r and e["name"] == "backward"), None)
        if end is not None:
            ax.plot([(end - t0) * scale] * 2, [2 * i - 0.4, 2 * i + 1.4], color="#444444", lw=0.8, ls=":")
    ax.set_yticks([y for i in range(len(ranks)) for y in (2 * i, 2 * i + 1)])
    ax.set_yticklabels([lab for r in ranks for lab in (f"rank {r} backward", f"rank {r} all-reduce")], fontsize=8)
    ax.set_ylim(2 * len(ranks) - 0.5, -0.6)
    ax.set_xlabel(f"time ({unit})")
    ax.set_title(f"step {step}: buckets all-reduced while backward runs")
    ax.legend(handles=[Patch(color=COLORS[k], label=lab) for k, lab in
                       (("compute", "backward"), ("collective", "bucket all-reduce"), ("wait", "wait + copy back"))],
              fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return ax


def plot_horovod_timeline(events: list[dict], ax=None, leaves_only: bool = True, unit: str = "ms", title: str = ""):
    """Horovod's timeline (`ddnb.data_parallel.horovod_timeline_events`) with
    `ddnb.viz.plot_timeline`: one row per tensor instead of per rank, negotiation and
    queueing grey ("wait"), the all-reduce red ("collective"), fusion-buffer copies
    ("other"). leaves_only: draw the phases, not the operation that contains them."""
    shown = [e for e in events if e.get("leaf", True) or not leaves_only]
    if not shown:
        raise ValueError("no events to draw (is the timeline empty? it needs at least one finished operation)")
    rows = sorted({e["row"] for e in shown})
    names = {e["row"]: e["tensor"] for e in shown}
    ax = plot_timeline([{**e, "rank": rows.index(e["row"])} for e in shown], ax=ax, arrows=False, unit=unit,
                       title=title or "Horovod timeline (written by rank 0)")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([names[r] for r in rows], fontsize=7)
    return ax
