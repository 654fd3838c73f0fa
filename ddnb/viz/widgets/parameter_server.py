"""A widget for the knobs of a parameter-server run (workers, server shards, mode,
staleness bound, straggler delay, steps): its Run button trains through the function it is
given (`ddnb.parameter_server.train_on_cluster` in the notebook) and draws every run so far
with `ddnb.viz.parameter_server.plot_convergence` and `ddnb.viz.parameter_server.plot_staleness`.
Taught in `notebooks/04_parameter_server.ipynb`.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from ddnb.viz.parameter_server import plot_convergence, plot_staleness
from ddnb.viz.png import figure_png


class ParameterServerExplorer:
    """Widgets for the knobs of a parameter-server run (workers, server shards, mode,
    staleness bound, straggler delay, steps); Run calls `run_fn(workers=, servers=, mode=,
    staleness=, straggler_delay=, steps=)`, which trains (e.g. `partial(train_on_cluster,
    cluster, model_fn, train_set, lr=0.05)`) and returns the list of per-rank dicts of
    `ddnb.parameter_server.train`, then draws the convergence and the staleness of every
    run so far. Results of every run are kept in `runs`."""

    def __init__(self, run_fn, max_workers: int = 4, steps: int = 100):
        import ipywidgets as widgets

        self.run_fn = run_fn
        self.runs: dict[str, list[dict]] = {}
        self.workers = widgets.IntSlider(value=max_workers, min=1, max=max_workers, description="workers")
        self.servers = widgets.IntSlider(value=1, min=1, max=2, description="servers")
        self.mode = widgets.Dropdown(options=["bsp", "asp", "ssp"], value="bsp", description="mode")
        self.staleness = widgets.IntSlider(value=2, min=0, max=8, description="staleness s")
        self.delay = widgets.FloatSlider(value=0.0, min=0.0, max=0.05, step=0.005, readout_format=".3f",
                                         description="straggler s")
        self.steps = widgets.IntSlider(value=steps, min=10, max=400, step=10, description="steps")
        self.button = widgets.Button(description="Run", button_style="primary")
        self.status = widgets.Label()
        self.image = widgets.Image(format="png")
        self.button.on_click(lambda _: self.run())
        self.widget = widgets.VBox([widgets.HBox([self.workers, self.servers, self.mode]),
                                    widgets.HBox([self.staleness, self.delay, self.steps]),
                                    widgets.HBox([self.button, self.status]), self.image])

    def run(self):
        """Run once with the widgets' values; errors are shown, not raised."""
        k, n = self.servers.value, self.workers.value
        label = f"{self.mode.value}{'(' + str(self.staleness.value) + ')' if self.mode.value == 'ssp' else ''}, " \
                f"{n} workers, {k} server{'s' if k > 1 else ''}, straggler {self.delay.value * 1e3:.0f} ms"
        self.status.value = f"running {label}..."
        try:
            self.runs[label] = self.run_fn(workers=n, servers=k, mode=self.mode.value,
                                           staleness=self.staleness.value if self.mode.value == "ssp" else 0,
                                           straggler_delay=self.delay.value, steps=self.steps.value)
        except Exception as e:  # noqa: BLE001 - shown to the learner
            self.status.value = f"{type(e).__name__}: {str(e).splitlines()[0]}"
            return None
        self.status.value = f"done: {label}"
        fig, axes = plt.subplots(1, 3, figsize=(15, 3.5))
        plot_convergence(self.runs, axes=axes[:2])
        plot_staleness(self.runs, ax=axes[2])
        fig.tight_layout()
        self.image.value = figure_png(fig)
        return self.runs[label]

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)
