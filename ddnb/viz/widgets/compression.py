"""A widget that trains with a chosen compression method on the cluster and times it on a
chosen emulated link, then plots every setting tried so far with
`ddnb.viz.compression.plot_accuracy_vs_bytes`.
Taught in `notebooks/14_precision_compression.ipynb`.
"""
from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import display

from ddnb.viz.compression import plot_accuracy_vs_bytes
from ddnb.viz.png import figure_png


def _train(method: str, steps: int, kwargs: dict) -> dict:
    """On every rank: `train_compressed` with `method`; its accuracy and last bytes per step."""
    from ddnb.compression.train import train_compressed

    r = train_compressed(method, steps=steps, **kwargs)
    return {"accuracy": r["accuracy"], "bytes_per_step": r["bytes"][max(r["bytes"])], "loss": r["losses"][-1]}


class CompressionExplorer:
    """Method, PowerSGD's rank r, top-k's fraction and the link: each change trains the
    digits MLP with that hook on the cluster (final accuracy, bytes per step from the
    trace, as `python -m ddnb.bench compress` does) and times a step of it beside the plain
    all-reduce's on an emulated cluster with that link (`ddnb.bench.compress_links`), then
    plots every setting tried so far as accuracy against bytes, labelled with its speedup
    on its link (x1.5: one and a half times faster than uncompressed there)."""

    METHODS = ("none", "fp16", "bf16", "powersgd", "topk", "sign")
    LINKS = {"0.1 GB/s": 1e8, "1 GB/s": 1e9, "10 GB/s": 1e10, "100 GB/s": 1e11}

    def __init__(self, cluster, steps: int = 60, time_link: bool = True, link_workers: int = 2):
        self.cluster, self.steps, self.time_link, self.link_workers = cluster, steps, time_link, link_workers
        self.points: list[dict] = []
        style = dict(continuous_update=False)
        self.method = widgets.Dropdown(options=self.METHODS, value="powersgd", description="method")
        self.rank = widgets.IntSlider(value=4, min=1, max=16, description="PowerSGD r", **style)
        self.ratio = widgets.FloatLogSlider(value=0.01, base=10, min=-3, max=0, description="top-k k/n", **style)
        self.link = widgets.Dropdown(options=list(self.LINKS), value="1 GB/s", description="link")
        self.status = widgets.Label()
        self.image = widgets.Image(format="png")
        for w in (self.method, self.rank, self.ratio, self.link):
            w.observe(lambda change: self.run(), names="value")
        self.widget = widgets.VBox([widgets.HBox([self.method, self.link]), widgets.HBox([self.rank, self.ratio]),
                                    self.status, self.image])

    def setting(self) -> tuple[str, str, dict]:
        """(bench name such as "powersgd:4", method, its keyword arguments) of the controls."""
        from ddnb._checks import Checks

        method = self.method.value
        with Checks("CompressionExplorer") as check:
            check.choice("method", method, self.METHODS)
            check.integer("rank", self.rank.value, min=1)
            check.number("ratio", self.ratio.value, positive=True, max=1)
            check.choice("link", self.link.value, list(self.LINKS))
        if method == "powersgd":
            return f"powersgd:{self.rank.value}", method, {"rank": self.rank.value, "start": 2}
        if method == "topk":
            return "topk", method, {"ratio": float(self.ratio.value)}
        return method, method, {}

    def run(self) -> dict | None:
        """Train and time the controls' setting; errors are shown in the widget, not raised."""
        from ddnb.bench.compress_links import link_sweep

        try:
            text, method, kwargs = self.setting()
            self.status.value = f"training with {text} ..."
            point = dict(self.cluster.run(_train, method, self.steps, kwargs)[0], method=text, link=self.link.value)
            if self.time_link:
                rows = link_sweep(["none", text], [self.LINKS[self.link.value]], workers=self.link_workers,
                                  steps=4, ratio=kwargs.get("ratio", 0.01))
                point.update(speedup=rows[1]["speedup"], step_time=rows[1]["step_time"])
        except Exception as e:  # noqa: BLE001 - shown to the learner
            self.status.value = f"{type(e).__name__}: {str(e).splitlines()[0]}"
            return None
        self.points.append(point)
        faster = f", step x{point['speedup']:.2f} vs uncompressed on {point['link']} (emulated)" \
            if "speedup" in point else ""
        self.status.value = (f"{text}: accuracy {point['accuracy']:.1%}, {point['bytes_per_step']:,} bytes per step"
                             + faster)
        fig, ax = plt.subplots(figsize=(7, 3.5))
        rows = [dict(p, method=f"{p['method']} @{p['link']}" + (f" x{p['speedup']:.2f}" if "speedup" in p else ""),
                     final_accuracy=p["accuracy"]) for p in self.points]
        plot_accuracy_vs_bytes(rows, ax=ax, title="settings tried: accuracy against bytes (label: emulated speedup)")
        self.image.value = figure_png(fig)
        return point

    def _ipython_display_(self):
        display(self.widget)
