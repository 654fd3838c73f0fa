"""Gradient flow as it happens, drawn from `ddnb.data_parallel.grad_flow`'s records:

    plot_gradient_flow(data, step)     one panel per rank: x = time within backward, y = layer;
                                       each layer's gradient from the moment backward produced
                                       it (|) until its bucket's all-reduce ended, coloured by
                                       this rank's local ‖grad‖; under it that all-reduce, from
                                       start to end (red bar, labelled b k); beside the panel a
                                       column of the averaged ‖grad‖ after the sync

The drawing takes plain data (a list of per-rank records), so it is tested without a
cluster; `ddnb.viz.widgets.gradient_flow.GradientFlowWidget` is the widget whose strategy,
workers and bucket size RE-RUN the training on the cluster and draw it with this.
Taught in `notebooks/06_data_parallelism.ipynb`.
"""
from __future__ import annotations

import math

import matplotlib.pyplot as plt

from ddnb._checks import Checks
from ddnb.viz.timeline import COLORS

LABELS = {"naive": "naive", "bucketed": "bucketed", "ddp": "DDP", "horovod": "Horovod"}


def _validate(data, step) -> None:
    with Checks("plot_gradient_flow") as check:
        if check.rule(isinstance(data, (list, tuple)) and len(data) > 0 and all(isinstance(r, dict) for r in data),
                      "data must be a non-empty list of per-rank records (gradient_flow's result)"):
            fewest = min(len(r.get("steps", [])) for r in data)
            check.integer("step", step, min=0, max=fewest - 1, why=f" (the records hold {fewest} steps)")


def plot_gradient_flow(data: list[dict], step: int = 0, unit: str = "ms", fig=None):
    """Draw step `step` of `data` (gradient_flow's per-rank records) on one colour scale
    (log10 ‖grad‖, local and averaged). Returns the figure."""
    _validate(data, step)
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    steps = [r["steps"][step] for r in data]
    layers = data[0]["layers"]
    values = [v for s in steps for v in s["local"] + s["averaged"] if v > 0]
    lo, hi = (math.log10(min(values)), math.log10(max(values))) if values else (-1.0, 0.0)
    hi = hi if hi > lo else lo + 1
    cmap, norm = plt.get_cmap("viridis"), plt.Normalize(lo, hi)
    color = lambda v: cmap(norm(math.log10(v))) if v > 0 else "white"   # noqa: E731
    fig = fig or plt.figure(figsize=(11, 0.4 + (0.6 + 0.17 * len(layers)) * len(data)), layout="constrained")
    grid = fig.add_gridspec(len(data), 2, width_ratios=[12, 1])
    t_max = max(max(s["sync_end"], max(b["end"] for b in s["buckets"])) for s in steps) * scale
    for row, (record, s) in enumerate(zip(data, steps)):
        ax = fig.add_subplot(grid[row, 0])
        held = {i: b["end"] for b in s["buckets"] for i in b["layers"]}
        for i, (t, v) in enumerate(zip(s["time"], s["local"])):   # from produced to averaged: local
            ax.barh(i - 0.12, max((held.get(i, t) - t) * scale, t_max * 4e-3), left=t * scale, height=0.45,
                    color=color(v), lw=0)
            ax.plot([t * scale] * 2, [i - 0.38, i + 0.12], color="black", lw=0.8)     # produced here
        for b in s["buckets"]:
            for j, i in enumerate(sorted(b["layers"])):
                ax.barh(i + 0.27, (b["end"] - b["start"]) * scale, left=b["start"] * scale, height=0.25,
                        color=COLORS["collective"], alpha=0.75, lw=0)
                if j == 0:
                    ax.text(b["start"] * scale, i + 0.27, f"b{b['id']} ", ha="right", va="center", fontsize=6)
        ax.axvline(s["backward_end"] * scale, color="#444444", lw=0.8, ls=":")
        ax.axvline(s["sync_end"] * scale, color="#444444", lw=0.8, ls="--")
        ax.set_xlim(-0.03 * t_max, t_max * 1.02)
        ax.set_ylim(len(layers) - 0.4, -0.6)
        ax.set_yticks(range(len(layers)))
        ax.set_yticklabels(layers if len(layers) <= 16 else [str(i) for i in range(len(layers))], fontsize=6)
        ax.set_ylabel(f"rank {record['rank']}", fontsize=9)
        if row == len(data) - 1:
            ax.set_xlabel(f"time since backward started ({unit})\nper layer: | its gradient produced, then held "
                          "(colour: local ‖grad‖) until its bucket's all-reduce (red, b k) ends\ndotted: backward's "
                          "last gradient; dashed: all averaged", fontsize=8)
        side = fig.add_subplot(grid[row, 1])
        im = side.imshow([[math.log10(v) if v > 0 else lo] for v in s["averaged"]], aspect="auto", cmap=cmap,
                         norm=norm)
        side.set_xticks([])
        side.set_yticks([])
        if row == 0:
            side.set_title("averaged", fontsize=8)
            ax.set_title(f"{LABELS.get(record['strategy'], record['strategy'])}, {record['workers']} workers, "
                         f"buckets of {record['bucket_mb']:g} MB: step {step}, local ‖grad‖ as backward "
                         "produces it", fontsize=10)
    fig.colorbar(im, ax=fig.axes, fraction=0.02, pad=0.01).set_label("log10 ‖grad‖")
    return fig
