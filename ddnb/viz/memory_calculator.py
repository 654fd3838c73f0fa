"""A calculator widget for `ddnb.cost.training_memory`: sizes in, a stacked bar out.

Each control (layers, width, heads, vocabulary, sequence length, batch, precision,
optimizer, dropout, the device's memory) recomputes the four parts (parameters,
gradients, optimizer state, activations) and redraws them with `ddnb.viz.plot_memory`
into an `ipywidgets.Image`, next to a line at the device's memory. A size the formula
rejects (zero, negative, d_model not divisible by the heads) is reported in the widget's
status line, never raised: a slider must not leave a traceback in the notebook.
Used in `notebooks/01_why_distributed.ipynb`."""
from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import display

from ddnb.cost.memory_model import OPTIMIZERS, PRECISIONS, training_memory
from ddnb.viz.memory import plot_memory
from ddnb.viz.controls import set_controls
from ddnb.viz.png import figure_png

GB = 1e9   # device memory is sold in decimal gigabytes: an "80 GB" device holds about 80e9 bytes
SIZES = ("n_layers", "d_model", "n_heads", "vocab_size", "seq_len", "batch_size")


def plot_training_memory(memory: dict, budget_gb: float | None = None, title: str = "", ax=None):
    """One stacked bar of {"parameters", "gradients", "optimizer", "activations"} bytes in
    GB (1e9 bytes), with a dashed line at `budget_gb`. Returns the Axes."""
    if ax is None:
        _, ax = plt.subplots(figsize=(4.2, 3.6))
    plot_memory([{k: v / GB * 2**30 for k, v in memory.items()}], labels=["one device"], unit="GB", ax=ax)
    ax.set_ylabel("memory (GB, 1e9 bytes)")
    if budget_gb:
        ax.axhline(budget_gb, color="k", ls="--", lw=1)
        ax.text(0.35, budget_gb, f"{budget_gb:g} GB", va="bottom", fontsize=8)
        ax.set_ylim(0, 1.15 * max(budget_gb, sum(memory.values()) / GB))
    if title:
        ax.set_title(title, fontsize=9)
    return ax


class MemoryCalculator:
    """Controls for every argument of `training_memory` and a budget; shows the bar.

        calc = MemoryCalculator(n_layers=96, d_model=12288, n_heads=96, vocab_size=50257,
                                seq_len=2048, batch_size=1, budget_gb=80)
        calc.update(batch_size=8)    # as if the slider moved; returns the dict or None
        calc                         # the widget
    """

    def __init__(self, n_layers=12, d_model=768, n_heads=12, vocab_size=50257, seq_len=1024, batch_size=8,
                 precision="mixed", optimizer="adam", dropout=True, budget_gb=80.0):
        self.controls = {
            "n_layers": widgets.IntSlider(value=n_layers, min=1, max=128, description="layers"),
            "d_model": widgets.IntText(value=d_model, description="d_model"),
            "n_heads": widgets.IntText(value=n_heads, description="heads"),
            "vocab_size": widgets.IntText(value=vocab_size, description="vocabulary"),
            "seq_len": widgets.IntText(value=seq_len, description="seq_len"),
            "batch_size": widgets.IntSlider(value=batch_size, min=1, max=64, description="batch"),
            "precision": widgets.Dropdown(options=list(PRECISIONS), value=precision, description="precision"),
            "optimizer": widgets.Dropdown(options=list(OPTIMIZERS), value=optimizer, description="optimizer"),
            "dropout": widgets.Checkbox(value=dropout, description="dropout"),
            "budget_gb": widgets.FloatText(value=budget_gb, description="device GB"),
        }
        for c in self.controls.values():
            c.continuous_update = False
            c.observe(self._changed, names="value")
        self._setting = False
        self.status = widgets.Label()
        self.image = widgets.Image(format="png")
        left = widgets.VBox(list(self.controls.values()))
        self.widget = widgets.VBox([widgets.HBox([left, self.image]), self.status])
        self.memory: dict | None = None
        self.update()

    def _changed(self, change) -> None:
        if not self._setting:
            self.update()

    def values(self) -> dict:
        return {k: c.value for k, c in self.controls.items()}

    def update(self, **values) -> dict | None:
        """Set any controls given, recompute and redraw. Returns the memory dict, or None
        when the sizes are rejected (the reason is in `self.status.value`)."""
        if not set_controls(self, values):
            return None
        v = self.values()
        budget = v.pop("budget_gb")
        try:
            if not budget > 0:
                raise ValueError(f"device memory must be > 0 GB, got budget_gb={budget!r}")
            mem = training_memory(**v)
        except Exception as e:  # noqa: BLE001 - shown to the learner, not raised
            self.memory = None
            self.status.value = f"{type(e).__name__}: {e}"
            return None
        self.memory = mem
        total = sum(mem.values()) / GB
        fits = "fits in" if total <= budget else "does not fit in"
        self.status.value = (f"parameters {mem['parameters'] / GB:.2f} + gradients {mem['gradients'] / GB:.2f} + "
                             f"optimizer {mem['optimizer'] / GB:.2f} + activations {mem['activations'] / GB:.2f} "
                             f"= {total:.2f} GB: {fits} {budget:g} GB")
        fig = plot_training_memory(mem, budget, title=f"{v['n_layers']} layers, d_model {v['d_model']}, "
                                   f"batch {v['batch_size']} x {v['seq_len']}, {v['precision']}").figure
        self.image.value = figure_png(fig)
        return mem

    def _ipython_display_(self):
        display(self.widget)
