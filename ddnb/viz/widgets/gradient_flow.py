"""A widget for gradient flow as it happens: strategy, workers and bucket size RE-RUN the
training on the cluster (`ddnb.data_parallel.grad_flow.gradient_flow`); a step slider picks
the step that `ddnb.viz.gradient_flow.plot_gradient_flow` draws.

    flow = GradientFlowWidget(cluster)

Taught in `notebooks/06_data_parallelism.ipynb` and `notebooks/07_horovod.ipynb` (with Horovod).
"""
from __future__ import annotations

import base64

import ipywidgets as widgets
from IPython.display import display

from ddnb._checks import Checks
from ddnb.viz.gradient_flow import LABELS, plot_gradient_flow
from ddnb.viz.png import figure_png

NO_HOROVOD = ("Horovod is not initialised on this cluster, so it is not offered: start one with "
              "ddnb.Cluster(horovod=True) (chapter 07). Chapter 06 leaves it off because Horovod's background "
              "thread keeps polling the cores even when idle.")


class GradientFlowWidget:
    """Pick a strategy (naive, bucketed, DDP, and Horovod when the cluster runs it), the
    number of workers (2..cluster size) and the bucket size: each change trains again on the
    cluster (`ddnb.data_parallel.grad_flow.gradient_flow`: a live run, not a replay); the
    step slider draws another step of the last run. `data` holds the last run's records.

        flow = GradientFlowWidget(cluster)
        flow                                    # the widget (a static figure where widgets do not run)
    """

    def __init__(self, cluster, strategy: str = "bucketed", workers: int | None = None, bucket_mb: float = 0.03,
                 steps: int = 3, layers: int = 10, width: int = 64, step: int = 1):
        self.cluster, self.kwargs = cluster, {"steps": steps, "layers": layers, "width": width}
        self.horovod = bool(getattr(cluster, "horovod", False))
        options = [s for s in LABELS if s != "horovod" or self.horovod]
        with Checks("GradientFlowWidget") as check:
            check.choice("strategy", strategy, options)
            check.integer("workers", workers, min=2, max=cluster.n, none=True, why=f" (2..{cluster.n})")
            check.integer("step", step, min=0, max=steps - 1, why=f" (steps={steps})")
        style = dict(continuous_update=False)
        self.strategy = widgets.Dropdown(options=[(LABELS[s], s) for s in options], value=strategy,
                                         description="strategy")
        self.workers = widgets.IntSlider(value=workers or cluster.n, min=2, max=cluster.n, description="workers",
                                         **style)
        self.bucket_mb = widgets.FloatLogSlider(value=bucket_mb, base=10, min=-3, max=0, step=0.1,
                                                description="bucket MB", readout_format=".3f", **style)
        self.step = widgets.IntSlider(value=step, min=0, max=steps - 1, description="step", **style)
        self.status = widgets.Label()
        self.note = widgets.Label("" if self.horovod else NO_HOROVOD)
        self.image = widgets.Image(format="png")
        for w in (self.strategy, self.workers, self.bucket_mb):
            w.observe(lambda _: self.run(), names="value")
        self.step.observe(lambda _: self.redraw(), names="value")
        self.widget = widgets.VBox([widgets.HBox([self.strategy, self.workers]),
                                    widgets.HBox([self.bucket_mb, self.step]), self.status, self.note, self.image])
        self.data: list[dict] = []
        self.run()

    def run(self) -> list[dict] | None:
        """Train with the controls' setting on the cluster and draw; errors are shown, not raised."""
        from ddnb.data_parallel.grad_flow import gradient_flow

        strategy = self.strategy.value
        self.workers.disabled = strategy == "horovod"
        workers = None if strategy == "horovod" else self.workers.value   # Horovod: every rank
        try:
            self.status.value = f"training with {LABELS[strategy]} on the cluster ..."
            self.data = gradient_flow(self.cluster, strategy, workers=workers, bucket_mb=float(self.bucket_mb.value),
                                      **self.kwargs)
        except Exception as e:  # noqa: BLE001 - shown to the learner
            self.status.value = f"{type(e).__name__}: {str(e).splitlines()[0]}"
            return None
        buckets = len(self.data[0]["steps"][self.step.value]["buckets"])
        self.status.value = (f"{LABELS[strategy]}: {len(self.data)} workers, {buckets} buckets at step "
                             f"{self.step.value} (a live run; move a control to run again)")
        self.redraw()
        return self.data

    def figure(self, step: int | None = None):
        return plot_gradient_flow(self.data, self.step.value if step is None else step)

    def redraw(self) -> None:
        if self.data:
            self.image.value = figure_png(self.figure())

    def _ipython_display_(self):
        # the widget where a widget manager runs; its current figure as a PNG elsewhere
        bundle = self.widget._repr_mimebundle_() or {}
        bundle = bundle[0] if isinstance(bundle, tuple) else bundle
        if self.image.value:
            bundle["image/png"] = base64.b64encode(self.image.value).decode("ascii")
        display(bundle, raw=True)
