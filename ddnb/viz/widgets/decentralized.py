"""A widget that re-runs D-PSGD / AD-PSGD (and all-reduce SGD beside them) on the cluster
for a topology, a worker count, mixing steps per SGD step and a straggler, and draws them
with `ddnb.viz.decentralized.plot_runs`. Taught in `notebooks/05b_decentralized.ipynb`.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from ddnb.viz.decentralized import plot_runs
from ddnb.viz.png import figure_png


class DecentralizedExplorer:
    """Dropdowns and sliders (topology, workers, mixing steps per SGD step, straggler delay);
    "run" resizes `cluster`, runs all-reduce SGD, D-PSGD and AD-PSGD with those settings and
    draws `plot_runs` plus the wall time per step into an image."""

    def __init__(self, cluster, model_fn, train, test, steps: int = 100, max_workers: int = 4):
        import ipywidgets as widgets

        self.cluster, self.model_fn, self.train, self.test, self.steps = cluster, model_fn, train, test, steps
        self.topology = widgets.Dropdown(options=["ring", "torus", "exponential", "complete"], value="ring",
                                         description="topology")
        self.workers = widgets.IntSlider(value=min(cluster.n, max_workers), min=2, max=max_workers,
                                         description="workers")
        self.mixing = widgets.IntSlider(value=1, min=1, max=4, description="mixing/step")
        self.delay = widgets.FloatSlider(value=0.0, min=0.0, max=0.02, step=0.005, readout_format=".3f",
                                         description="straggler s")
        self.button = widgets.Button(description="run")
        self.status, self.image = widgets.Label(), widgets.Image(format="png")
        self.button.on_click(lambda _: self.run())
        self.widget = widgets.VBox([widgets.HBox([self.topology, self.workers]),
                                    widgets.HBox([self.mixing, self.delay, self.button]), self.status, self.image])

    def run(self) -> dict | None:
        """Run the three methods with the current settings and redraw; errors go to the status line."""
        from ddnb.decentralized import DecentralizedConfig, train_adpsgd, train_allreduce_sgd, train_dpsgd

        n, delay = self.workers.value, self.delay.value
        config = DecentralizedConfig(topology=self.topology.value, steps=self.steps, measure_every=10,
                                     gossip_steps=self.mixing.value, straggler_rank=n - 1 if delay else None,
                                     straggler_delay=delay)
        try:
            config.validate(n)
            self.cluster.resize(n)
            runs = {name: self.cluster.run(fn, config, self.model_fn, self.train, self.test)
                    for name, fn in (("all-reduce SGD", train_allreduce_sgd),
                                     (f"D-PSGD {config.topology}", train_dpsgd),
                                     (f"AD-PSGD {config.topology}", train_adpsgd))}
        except Exception as e:  # noqa: BLE001 - shown to the learner
            self.status.value = f"{type(e).__name__}: {e}"
            return None
        self.status.value = "  ".join(f"{k}: {1e3 * max(r['wall_time'] for r in v) / self.steps:.1f} ms/step"
                                      for k, v in runs.items())
        axes = plot_runs(runs)
        self.image.value = figure_png(axes[0].figure)
        plt.close(axes[0].figure)
        return runs

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)
