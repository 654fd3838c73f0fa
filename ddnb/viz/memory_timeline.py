"""Memory through one step, per rank: stacked areas of parameters, gradients, optimizer
state and activations at each event of the step (`ddnb.memory_timeline`), and a widget
that re-runs the step on the cluster when its strategy or worker count changes.

`plot_memory_timeline` takes plain data, the [(label, index, {part: bytes})] of each rank,
so it draws without a cluster; `MemoryTimelineWidget` measures on real processes and
redraws into an `ipywidgets.Image` (see `ddnb.viz.widgets`). Taught in
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


class MemoryTimelineWidget:
    """A strategy drop-down and a worker-count slider; each change runs one step on the
    first `workers` ranks of `cluster` (`ddnb.memory_timeline.memory_timeline`) and redraws
    the per-rank timelines. Errors (e.g. tp on 3 workers: 4 heads do not split 3 ways)
    are shown in the status line, not raised.

        w = MemoryTimelineWidget(cluster, strategy="zero3")
        w                          # the controls and the picture
        w.timelines                # what was measured last: per rank, [(label, index, bytes)]
    """

    def __init__(self, cluster, strategy: str = "dp", workers: int | None = None, unit: str = "KB", **kwargs):
        import ipywidgets as widgets

        from ddnb.memory_timeline import STRATEGIES

        workers = cluster.n if workers is None else workers
        with Checks("MemoryTimelineWidget") as check:
            check.choice("strategy", strategy, STRATEGIES)
            check.integer("workers", workers, min=1, max=cluster.n)
            check.choice("unit", unit, UNITS)
        self.cluster, self.unit, self.kwargs = cluster, unit, kwargs
        self.timelines: list = []
        self.strategy = widgets.Dropdown(options=list(STRATEGIES), value=strategy, description="strategy")
        self.workers = widgets.IntSlider(value=workers, min=1, max=cluster.n, description="workers",
                                         continuous_update=False)
        self.status = widgets.Label()
        self.image = widgets.Image(format="png")
        for control in (self.strategy, self.workers):
            control.observe(lambda change: self.update(), names="value")
        self.widget = widgets.VBox([widgets.HBox([self.strategy, self.workers]), self.status, self.image])
        self.update()

    def update(self) -> list | None:
        """Run the selected strategy on the selected workers and redraw; the timelines, or
        None after an error (shown in `status`)."""
        from ddnb.memory_timeline import memory_timeline
        from ddnb.viz.png import figure_png

        s, n = self.strategy.value, self.workers.value
        self.status.value = f"{s} on {n} workers: running one step..."
        try:
            self.timelines = memory_timeline(self.cluster, s, n, **self.kwargs)
        except Exception as e:  # noqa: BLE001 - shown to the learner
            self.status.value = f"{s} on {n} workers: {type(e).__name__}: {e}"
            return None
        axes = plot_memory_timeline(self.timelines, title=f"{s}, {n} worker(s): one training step", unit=self.unit)
        self.image.value = figure_png(axes[0].figure)
        peak = max(peak_parts(ev)["total"] for ev in self.timelines)
        self.status.value = f"{s} on {n} workers: the fullest rank peaks at {peak / UNITS[self.unit]:.0f} {self.unit}"
        return self.timelines

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)
