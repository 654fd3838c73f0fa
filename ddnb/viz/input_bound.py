"""Which stage bounds the input pipeline: storage, decode or compute, as bars and as a widget.

    parts = pipeline_bound(workers=2, shard_samples=1000, decode_s=2e-3, step_s=0.1)
    plot_input_bound(parts)            # three bars (seconds per batch), the bound one highlighted
    InputBoundExplorer()               # sliders: workers, shard size, decode cost, step time

The numbers come from `ddnb.data_pipeline.calculator.pipeline_bound` (the model: a step
takes the slowest stage when DataLoader workers overlap them, their sum with none).
A value the model rejects is shown in the status line, never raised.
Used in `notebooks/01b_data_pipeline.ipynb`.
"""
from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import display

from ddnb.data_pipeline.calculator import STAGES, pipeline_bound
from ddnb.viz.png import figure_png


def plot_input_bound(parts: dict, title: str = "", ax=None):
    """Bars of parts["storage"], ["decode"], ["compute"] in ms per batch; the bound stage
    (parts["bound"]) drawn in red and named as input-bound or compute-bound. Returns the Axes."""
    if ax is None:
        _, ax = plt.subplots(figsize=(4.2, 3.0))
    ms = [parts[s] * 1e3 for s in STAGES]
    colors = ["tab:red" if s == parts.get("bound") else "tab:gray" for s in STAGES]
    ax.bar(STAGES, ms, color=colors)
    kind = "compute-bound" if parts.get("bound") == "compute" else "input-bound"
    ax.set_ylabel("ms per batch")
    ax.set_title(title or f"{kind}: {parts.get('bound')} sets the step ({parts['step_s'] * 1e3:.3g} ms)", fontsize=9)
    return ax


class InputBoundExplorer:
    """Sliders for workers, shard size (samples), decode + augment cost (ms per sample) and
    the model's step time (ms), over `pipeline_bound` with the other arguments fixed.

        ex = InputBoundExplorer(batch_size=256)
        ex.update(workers=8)       # as if the slider moved; returns the dict or None
    """

    def __init__(self, workers=2, shard_samples=1000, decode_ms=2.0, step_ms=100.0, **fixed):
        self.fixed = fixed
        self.controls = {
            "workers": widgets.IntSlider(value=workers, min=0, max=64, description="workers"),
            "shard_samples": widgets.IntSlider(value=shard_samples, min=1, max=10000, description="shard size"),
            "decode_ms": widgets.FloatSlider(value=decode_ms, min=0.0, max=20.0, step=0.1, description="decode ms"),
            "step_ms": widgets.FloatSlider(value=step_ms, min=1.0, max=1000.0, step=1.0, description="step ms"),
        }
        for c in self.controls.values():
            c.continuous_update = False
            c.observe(lambda change: self.update(), names="value")
        self.status = widgets.Label()
        self.image = widgets.Image(format="png")
        self.widget = widgets.VBox([widgets.HBox([widgets.VBox(list(self.controls.values())), self.image]),
                                    self.status])
        self.parts: dict | None = None
        self.update()

    def update(self, **values) -> dict | None:
        """Set any controls given, recompute and redraw; None (reason in status) if rejected."""
        try:
            for k, v in values.items():
                self.controls[k].value = v
            v = {k: c.value for k, c in self.controls.items()}
            parts = pipeline_bound(workers=v["workers"], shard_samples=v["shard_samples"],
                                   decode_s=v["decode_ms"] / 1e3, step_s=v["step_ms"] / 1e3, **self.fixed)
        except Exception as e:  # noqa: BLE001 - shown to the learner, not raised
            self.parts, self.status.value = None, f"{type(e).__name__}: {e}"
            return None
        self.parts = parts
        self.status.value = (f"storage {parts['storage'] * 1e3:.3g} ms, decode {parts['decode'] * 1e3:.3g} ms, "
                             f"compute {parts['compute'] * 1e3:.3g} ms per batch -> bound by {parts['bound']}")
        self.image.value = figure_png(plot_input_bound(parts).figure)
        return parts

    def _ipython_display_(self):
        display(self.widget)
