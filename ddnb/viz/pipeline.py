"""The pictures of pipeline parallelism, from plain data:

    plot_pipeline(events)            the classic pipeline diagram: one row per rank (stage),
                                     one box per forward / backward / weight gradient
                                     labelled with its micro-batch, F, B and W in three
                                     colours (W: Qi et al. 2024, "Zero Bubble Pipeline
                                     Parallelism", Sec. 2), idle time blank, a legend;
                                     from measured `ddnb.trace` events or `simulate`d ones
    plot_schedule(schedule)          the same for a schedule on paper (no cluster needed)
    plot_schedules({label: schedule})   several on paper, stacked on one time axis
    plot_bubble(p, measured)         bubble fraction against m: (p-1)/(m+p-1) and measurements
    plot_activation_peaks(peaks)     peak activation bytes per stage, one bar per schedule
    PipelineExplorer()               sliders for p, m and v redrawing GPipe, 1F1B, interleaved

Taught in `notebooks/09_pipeline_parallelism.ipynb`; W in `notebooks/09b_zero_bubble.ipynb`.
"""
from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import display
from matplotlib.patches import Patch

from ddnb.cost.pipeline import interleaved_bubble_fraction, peak_microbatches_in_flight, pipeline_bubble_fraction
from ddnb.pipeline_parallel.schedules import bubble_fraction, get_schedule, simulate
from ddnb.viz.memory import UNITS as BYTES   # binary multiples, as every byte axis of ddnb.viz
from ddnb.viz.png import figure_png

COLORS = {"F": "#4c72b0", "B": "#dd8452", "W": "#55a868"}
CHUNK_COLORS = {"F": ("#4c72b0", "#8da5d3", "#2e4a78", "#b8c8e6"),   # interleaved: one shade per model chunk
                "B": ("#dd8452", "#ecb28c", "#a85a2c", "#f4cfb5"),
                "W": ("#55a868", "#95c9a2", "#357044", "#c3e3cb")}
OP_NAMES = {"F": "forward", "B": "backward", "W": "weight gradient"}
UNITS = {"s": 1.0, "ms": 1e3, "us": 1e6, None: 1.0}


def plot_pipeline(events: list[dict], ax=None, title: str = "", unit: str | None = "ms", labels: bool = True,
                  ranks: int | None = None):
    """Draw the "compute" events that carry op ("F"/"B"/"W") and microbatch: rows are
    ranks (rank 0 on top), boxes span start..end, labelled with the micro-batch, one colour
    per op (W, the weight gradient, in its own: where a schedule splits the backward, B is
    the input gradient alone), one shade per model chunk when events carry "chunk"
    (interleaved, ZB-V, DualPipeV), and a legend of what is drawn. unit: "ms", "us", "s"
    for measured seconds, None for simulated time units. Returns the Axes."""
    boxes = [e for e in events if e.get("kind") == "compute" and e.get("op") in COLORS]
    n = ranks if ranks is not None else 1 + max((e["rank"] for e in boxes), default=0)
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.8 + 0.5 * n))
    t0 = min((e["start"] for e in boxes), default=0.0)
    scale = UNITS[unit]
    t1 = max(((e["end"] - t0) * scale for e in boxes), default=1.0)
    for e in boxes:
        left, width = (e["start"] - t0) * scale, (e["end"] - e["start"]) * scale
        color = CHUNK_COLORS[e["op"]][e.get("chunk", 0) % 4]
        ax.barh(e["rank"], width, left=left, height=0.8, color=color, edgecolor="white", linewidth=0.5)
        if labels and width > t1 / 90:
            ax.text(left + width / 2, e["rank"], str(e["microbatch"]), ha="center", va="center",
                    fontsize=7, color="white")
    ax.set_yticks(range(n))
    ax.set_yticklabels([f"rank {r}" for r in range(n)])
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_xlim(0, t1 * 1.01)
    ax.set_xlabel(f"time ({unit})" if unit else "time (one forward = 1)")
    chunks = 1 + max((e.get("chunk", 0) for e in boxes), default=0)
    split = any(e["op"] == "W" for e in boxes)
    names = dict(OP_NAMES, B="backward (input gradient)" if split else "backward")
    handles = [Patch(color=CHUNK_COLORS[op][c % 4], label=names[op] + (f" chunk {c}" if chunks > 1 else ""))
               for op in ("F", "B", "W") if op != "W" or split for c in range(chunks)]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7, frameon=False)
    if title:
        ax.set_title(title, fontsize=10)
    return ax


def plot_schedule(schedule, t_forward: float = 1.0, t_backward: float = 2.0, ax=None, title: str | None = None,
                  t_weight: float | None = None):
    """A schedule (a list of actions per rank, or a `Schedule` with its placement) drawn
    as `simulate` runs it, titled with its simulated bubble fraction. t_backward is the
    whole backward; where the schedule has W actions B and W share it (t_weight, default
    half: F = B = W = 1, Qi et al. 2024, Sec. 2.1). Returns the Axes."""
    events = simulate(schedule, t_forward, t_backward, t_weight=t_weight)
    if title is None:
        title = f"p={len(schedule)}, bubble {bubble_fraction(events):.3f}"
    return plot_pipeline(events, ax=ax, title=title, unit=None, ranks=len(schedule))


def plot_schedules(schedules: dict, t_forward: float = 1.0, t_backward: float = 2.0, width: float = 9.0):
    """Several schedules on paper ({title: schedule}), one under the other on one time
    axis, so that their lengths compare; each title gets its simulated bubble. Returns
    the Figure."""
    p = max((len(s) for s in schedules.values()), default=1)
    fig, axes = plt.subplots(len(schedules), 1, figsize=(width, 0.8 + 0.55 * p * len(schedules)), squeeze=False)
    axes = list(axes[:, 0])
    for ax, (label, schedule) in zip(axes, schedules.items()):
        plot_schedule(schedule, t_forward, t_backward, ax=ax)
        ax.set_title(f"{label}: {ax.get_title().split(', ', 1)[-1]}", fontsize=10)
    right = max(ax.get_xlim()[1] for ax in axes)
    for ax in axes:
        ax.set_xlim(0, right)
    fig.tight_layout()
    return fig


def plot_bubble(stages: int, measured: dict | None = None, microbatches=range(1, 17), ax=None, title: str = ""):
    """The analytic bubble (p-1)/(m+p-1) against m, with `measured` {m: fraction, ...}
    (or {label: {m: fraction}} for several series) as points. Returns the Axes."""
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.2))
    ms = list(microbatches)
    ax.plot(ms, [pipeline_bubble_fraction(stages, m) for m in ms], color="#444444",
            label=f"(p-1)/(m+p-1), p={stages}")
    series = measured or {}
    if series and not isinstance(next(iter(series.values())), dict):
        series = {"measured": series}
    for i, (name, points) in enumerate(series.items()):
        xs = sorted(points)
        ax.plot(xs, [points[m] for m in xs], "o", color=f"C{i}", label=name)
    ax.set_xlabel("micro-batches m")
    ax.set_ylabel("bubble fraction")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    return ax


def plot_activation_peaks(peaks: dict[str, list[int]], ax=None, unit: str = "KB", title: str = ""):
    """Grouped bars: for each stage, one bar per schedule ({"GPipe": [bytes per rank],
    "1F1B": [...]}), in `unit`. Returns the Axes."""
    if unit not in BYTES:
        raise ValueError(f"unit={unit!r} is not one of {tuple(BYTES)}")
    n = max((len(v) for v in peaks.values()), default=0)
    if ax is None:
        _, ax = plt.subplots(figsize=(1.5 + 1.3 * max(n, 1), 3.2))
    width = 0.8 / max(len(peaks), 1)
    for i, (name, vals) in enumerate(peaks.items()):
        xs = [r - 0.4 + width * (i + 0.5) for r in range(len(vals))]
        ax.bar(xs, [v / BYTES[unit] for v in vals], width=width, color=f"C{i}", label=name)
    ax.set_xticks(range(n))
    ax.set_xticklabels([f"rank {r}" for r in range(n)])
    ax.set_ylabel(f"peak activations ({unit})")
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    return ax


class PipelineExplorer:
    """Sliders for the stages p, micro-batches m and model chunks v; each move redraws
    GPipe, 1F1B and interleaved 1F1B (simulated, backward = 2 x forward) with their
    bubble and the micro-batches stage 0 holds at its peak. No cluster needed.

        explorer = PipelineExplorer(stages=4, microbatches=8)
        explorer                       # the sliders and the picture
    """

    def __init__(self, stages: int = 4, microbatches: int = 8, chunks: int = 2, max_stages: int = 8,
                 max_microbatches: int = 16, max_chunks: int = 4):
        self.p = widgets.IntSlider(value=stages, min=1, max=max_stages, description="stages p",
                                   continuous_update=False)
        self.m = widgets.IntSlider(value=microbatches, min=1, max=max_microbatches, description="micro-batches m",
                                   continuous_update=False, style={"description_width": "initial"})
        self.v = widgets.IntSlider(value=chunks, min=1, max=max_chunks, description="chunks v",
                                   continuous_update=False)
        self.status = widgets.Label()
        self.image = widgets.Image(format="png")
        for s in (self.p, self.m, self.v):
            s.observe(lambda change: self.redraw(), names="value")
        self.widget = widgets.VBox([widgets.HBox([self.p, self.m, self.v]), self.status, self.image])
        self.redraw()

    def redraw(self) -> None:
        p, m, v = self.p.value, self.m.value, self.v.value
        rows = [("gpipe", "GPipe"), ("1f1b", "1F1B")] + ([("interleaved", f"interleaved 1F1B, v={v}")]
                                                         if m % p == 0 else [])
        shown = {}
        for name, label in rows:
            peak = peak_microbatches_in_flight(name, p, m, 0, v)
            held = f"{peak / v:g} stage-micro-batches" if name == "interleaved" else \
                f"{peak} micro-batch{'es' if peak > 1 else ''}"
            shown[f"{label}: stage 0 holds {held}"] = get_schedule(name, p, m, v)
        self.image.value = figure_png(plot_schedules(shown))          # one time axis: the lengths compare
        inter = (f"interleaved (p-1)/(vm+p-1) = {interleaved_bubble_fraction(p, m, v):.3f}" if m % p == 0
                 else f"interleaved needs m % p == 0 ({m} % {p} = {m % p})")
        self.status.value = (f"p={p}, m={m}: bubble (p-1)/(m+p-1) = {pipeline_bubble_fraction(p, m):.3f} "
                             f"for GPipe and 1F1B; {inter}")

    def _ipython_display_(self):
        display(self.widget)
