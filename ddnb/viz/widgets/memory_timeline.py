"""A widget that re-runs one training step on the cluster (`ddnb.memory_timeline.memory_timeline`)
when its strategy or worker count changes, and redraws the per-rank memory timelines
(`ddnb.viz.memory_timeline.plot_memory_timeline`) into an `ipywidgets.Image`.
Taught in `notebooks/11_memory_sharding.ipynb`.
"""
from __future__ import annotations

from ddnb._checks import Checks
from ddnb.viz.memory import UNITS
from ddnb.viz.memory_timeline import peak_parts, plot_memory_timeline
from ddnb.viz.png import figure_png


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
