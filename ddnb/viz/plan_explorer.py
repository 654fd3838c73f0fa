"""The layout planner as a picture and a widget: `ddnb.cost.planner.plan`'s ranked layouts
drawn as stacked bars of their predicted step parts, and controls (model size, link,
workers, memory per worker, batch) that re-plan and redraw, so the learner watches the best
layout change. Nothing runs but the formulas (chapter 11's memory, chapter 12's time on
every axis); the emulated cluster checks them in the capstone.
Used in `notebooks/16_capstone.ipynb`.
"""
from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import display

from ddnb.cost.layout import PARTS
from ddnb.cost.planner import best, plan, plan_table
from ddnb.emulate.profile import PROFILES
from ddnb.viz.controls import set_controls
from ddnb.viz.png import figure_png

COLORS = {"compute": "tab:blue", "bubble": "tab:gray", "tp_comm": "tab:orange", "cp_comm": "tab:purple",
          "pp_comm": "tab:green", "dp_comm": "tab:red"}


def short_layout(row: dict) -> str:
    """'dp 8 pp 2 tp 4 cp 1 z1 ckpt b2' from a plan row: the axes, ZeRO stage, checkpointing
    and micro-batch size, short enough for a bar label."""
    ckpt = " ckpt" if row["checkpointing"] else ""
    chunks = f" v{row['chunks']}" if row.get("chunks", 1) > 1 else ""
    return (f"dp{row['dp']} pp{row['pp']} tp{row['tp']} cp{row['cp']} z{row['zero']}{ckpt} "
            f"b{row['microbatch_size']}{chunks}")


def plot_plan(rows: list[dict], top: int = 6, ax=None, title: str = ""):
    """The first `top` layouts that fit, fastest at the top, each a horizontal bar of its
    predicted step time split into compute, bubble and each axis's communication (seconds).
    Returns the Axes."""
    ok = [r for r in rows if r["fits"]][:top]
    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 0.45 * max(len(ok), 1) + 1.0))
    labels = [short_layout(r) for r in ok][::-1]
    left = [0.0] * len(ok)
    for part in PARTS:
        widths = [r["parts"][part] for r in ok][::-1]
        if any(widths):
            ax.barh(labels, widths, left=left, color=COLORS[part], label=part)
        left = [a + b for a, b in zip(left, widths)]
    ax.set_xlabel("predicted step time (s)")
    if ok:
        ax.legend(fontsize=7, loc="lower right", ncol=3)
    ax.set_title(title or f"{len(ok)} fastest layouts that fit", fontsize=9)
    return ax


class PlanExplorer:
    """Controls for the model's shape, the cluster profile, workers, memory per worker and
    the global batch; each change re-plans and shows the fastest layouts, their bars, and
    why the others were dropped.

        explorer = PlanExplorer(n_layers=32, d_model=4096, n_heads=32, workers=64)
        explorer.update(memory_gb=40)   # as if the control moved; returns the rows or None
        explorer.best                   # the fastest layout that fits (a plan row) or None
        explorer                        # the widget
    """

    def __init__(self, n_layers=32, d_model=4096, n_heads=32, vocab_size=51200, seq_len=2048, profile="ib",
                 workers=64, memory_gb=80.0, global_batch=512, top=6):
        self.top = top
        self.controls = {
            "n_layers": widgets.IntSlider(value=n_layers, min=1, max=128, description="layers"),
            "d_model": widgets.IntText(value=d_model, description="d_model"),
            "n_heads": widgets.IntText(value=n_heads, description="heads"),
            "vocab_size": widgets.IntText(value=vocab_size, description="vocabulary"),
            "seq_len": widgets.IntText(value=seq_len, description="seq_len"),
            "profile": widgets.Dropdown(options=list(PROFILES), value=profile, description="link"),
            "workers": widgets.Dropdown(options=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512], value=workers,
                                        description="workers"),
            "memory_gb": widgets.FloatText(value=memory_gb, description="GB / worker"),
            "global_batch": widgets.IntText(value=global_batch, description="batch"),
        }
        for c in self.controls.values():
            c.continuous_update = False
            c.observe(self._changed, names="value")
        self._setting = False
        self.status = widgets.Label()
        self.image = widgets.Image(format="png")
        self.table = widgets.Textarea(layout=widgets.Layout(width="98%", height="9em"), disabled=True)
        left = widgets.VBox(list(self.controls.values()))
        self.widget = widgets.VBox([widgets.HBox([left, self.image]), self.status, self.table])
        self.rows: list[dict] | None = None
        self.best: dict | None = None
        self.update()

    def _changed(self, change) -> None:
        if not self._setting:
            self.update()

    def values(self) -> dict:
        return {k: c.value for k, c in self.controls.items()}

    def update(self, **values) -> list[dict] | None:
        """Set any controls given, re-plan and redraw. Returns the plan's rows, or None when
        the inputs are rejected (the planner's message is in `self.status.value`)."""
        if not set_controls(self, values):
            return None
        v = self.values()
        model = {k: v[k] for k in ("n_layers", "d_model", "n_heads", "vocab_size", "seq_len")}
        try:
            rows = plan(model, v["profile"], v["workers"], v["memory_gb"] * 1e9, v["global_batch"])
        except Exception as e:  # noqa: BLE001 - shown to the learner, not raised
            self.rows = self.best = None
            self.status.value = f"{type(e).__name__}: {e}"
            return None
        self.rows, self.best = rows, best(rows)
        fits = sum(r["fits"] for r in rows)
        if self.best is None:
            self.status.value = f"no layout of {v['workers']} workers fits {v['memory_gb']:g} GB: see why below"
        else:
            self.status.value = (f"best: {self.best['layout']}, {self.best['step_time']:.3g} s a step, "
                                 f"{self.best['memory'] / 1e9:.3g} GB; {fits} of {len(rows)} layouts fit")
        self.table.value = plan_table(rows, top=self.top, dropped=5)
        fig = plot_plan(rows, top=self.top, title=f"{v['n_layers']} layers x d_model {v['d_model']} on "
                        f"{v['workers']} workers ({v['profile']}), {v['memory_gb']:g} GB each").figure
        self.image.value = figure_png(fig)
        return rows

    def _ipython_display_(self):
        display(self.widget)
