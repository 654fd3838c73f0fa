"""A widget that varies the number of workers of a `ddnb.Cluster` and re-measures
(`ddnb.viz.scaling` draws what it measured). Taught in `notebooks/00_getting_started.ipynb`,
`notebooks/05_allreduce.ipynb` and `notebooks/06_data_parallelism.ipynb`.
"""
from __future__ import annotations

import ipywidgets as widgets
from IPython.display import display

from ddnb.viz.png import figure_png
from ddnb.viz.scaling import plot_scaling, plot_time_vs_workers


class WorkerCountExplorer:
    """A slider for the number of workers. Moving it resizes the cluster, calls
    `measure(cluster)` (which returns seconds) and redraws every value measured so far.

        explorer = WorkerCountExplorer(cluster, measure, max_workers=4)
        explorer.sweep([1, 2, 3, 4])   # measure several sizes at once
        explorer                       # the slider and the plot
    """

    def __init__(self, cluster, measure, max_workers: int = 4, title: str = "", unit: str = "ms",
                 efficiency: bool = False):
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self.cluster, self._measure, self.title, self.unit = cluster, measure, title, unit
        self.efficiency = efficiency   # also draw T(1) / (N T(N)): `measure` times the same work at every N
        self.times: dict[int, float] = {}
        self.slider = widgets.IntSlider(value=min(cluster.n, max_workers), min=1, max=max_workers,
                                        description="workers", continuous_update=False)
        self.status = widgets.Label()
        self.image = widgets.Image(format="png")
        self.slider.observe(lambda change: self.measure(change["new"]), names="value")
        self.widget = widgets.VBox([self.slider, self.status, self.image])

    def measure(self, n: int) -> float | None:
        """Resize to n workers, measure, redraw. Errors are shown in the widget, not raised
        (a slider must not leave a traceback in the notebook)."""
        self.status.value = f"measuring with {n} workers..."
        try:
            self.cluster.resize(n)
            self.times[n] = float(self._measure(self.cluster))
        except Exception as e:  # noqa: BLE001 - shown to the learner
            self.status.value = f"{n} workers: {type(e).__name__}: {e}"
            return None
        self.status.value = f"{n} workers: {self.times[n] * 1e3:.3f} ms"
        self.redraw()
        return self.times[n]

    def sweep(self, ns) -> dict[int, float]:
        for n in ns:
            self.measure(n)
        return dict(sorted(self.times.items()))

    def redraw(self) -> None:
        if self.efficiency:
            fig = plot_scaling(self.times, title=self.title, unit=self.unit)[0].figure
        else:
            fig = plot_time_vs_workers(self.times, title=self.title, unit=self.unit).figure
        self.image.value = figure_png(fig)

    def _ipython_display_(self):
        display(self.widget)
