"""ZeRO's memory per device, stage by stage: bars from `ddnb.cost.zero_memory_parts`, and a
calculator widget for model size, world size and stage. Plain numbers in, no cluster.
Used in `notebooks/11_memory_sharding.ipynb`."""
from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import display

from ddnb.cost.zero import zero_memory_parts
from ddnb.viz.memory import UNITS, plot_memory
from ddnb.viz.png import figure_png


def plot_zero_stages(num_params, world_size: int, k: float = 12, param_bytes: float = 2, grad_bytes: float = 2,
                     stage: int | None = None, unit: str = "GB", ax=None, title: str | None = None):
    """One stacked bar per ZeRO stage 0-3 (parameters, gradients, optimizer state per device,
    Rajbhandari et al. 2020, Figure 1); `stage` (if given) is outlined. Units are decimal
    (GB = 1e9 bytes) as in the paper. Returns the Axes."""
    decimal = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9}
    if unit not in decimal:
        raise ValueError(f"unit={unit!r} is not one of {tuple(decimal)}")
    rescale = UNITS[unit] / decimal[unit]          # plot_memory divides by binary units
    per_stage = [{part: b * rescale for part, b in zero_memory_parts(num_params, world_size, s, k, param_bytes,
                                                                     grad_bytes).items()} for s in range(4)]
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.4))
    if title is None:
        title = f"Ψ = {num_params / 1e9:g} B parameters on N = {world_size} devices, K = {k:g}"
    plot_memory(per_stage, title=title, ax=ax, unit=unit, labels=[f"stage {s}" for s in range(4)])
    if stage is not None:
        n_parts = len(ax.patches) // 4
        for part in range(n_parts):
            bar = ax.patches[part * 4 + stage]
            bar.set_edgecolor("black")
            bar.set_linewidth(2)
        ax.get_xticklabels()[stage].set_fontweight("bold")
    ax.set_ylabel(f"per-device memory ({unit})")
    return ax


class ZeroMemoryExplorer:
    """Model size (billions of parameters), world size N, stage and K: the per-device bytes
    of the chosen stage in words, and the four stages as bars. A bad value (0 devices,
    stage 5, a negative size) shows its error in the widget, never a traceback.

        ZeroMemoryExplorer(billions=7.5, world_size=64)   # the paper's example
    """

    def __init__(self, billions: float = 7.5, world_size: int = 64, stage: int = 3, k: float = 12,
                 budget_gb: float = 80):
        self.billions = widgets.FloatText(value=billions, description="Ψ (billions)",
                                          style={"description_width": "initial"})
        self.world_size = widgets.IntText(value=world_size, description="devices N")
        self.stage = widgets.Dropdown(options=[0, 1, 2, 3], value=stage, description="stage")
        self.k = widgets.FloatText(value=k, description="K (bytes)")
        self.budget_gb = widgets.FloatText(value=budget_gb, description="device GB",
                                           style={"description_width": "initial"})
        self.status = widgets.Label()
        self.image = widgets.Image(format="png")
        controls = (self.billions, self.world_size, self.stage, self.k, self.budget_gb)
        for c in controls:
            c.observe(lambda change: self.redraw(), names="value")
        self.widget = widgets.VBox([widgets.HBox(list(controls[:3])), widgets.HBox(list(controls[3:])),
                                    self.status, self.image])
        self.redraw()

    def redraw(self) -> bool:
        """Recompute and redraw; False (with the error in the status line) on bad input."""
        psi, n, s, k = self.billions.value * 1e9, self.world_size.value, self.stage.value, self.k.value
        try:
            parts = zero_memory_parts(psi, n, s, k)
            stage0 = sum(zero_memory_parts(psi, n, 0, k).values())
            ax = plot_zero_stages(psi, n, k, stage=s)
            ax.axhline(self.budget_gb.value, color="gray", linestyle="--", linewidth=1)
        except ValueError as e:
            plt.close("all")
            self.status.value = f"cannot compute: {e}"
            return False
        total = sum(parts.values())
        fits = "fits" if total <= self.budget_gb.value * 1e9 else "does not fit"
        self.status.value = (f"stage {s}: {total / 1e9:.1f} GB of model states per device "
                             f"({stage0 / total:.1f}x less than stage 0); {fits} in {self.budget_gb.value:g} GB")
        self.image.value = figure_png(ax.figure)
        return True

    def _ipython_display_(self):
        display(self.widget)
