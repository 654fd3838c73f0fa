"""Final accuracy against bytes sent per step, one point per compression method (log x):
what each method buys and what it costs. Takes the rows of
`ddnb.bench.compress.compress_rows` (dicts with method, bytes_per_step, final_accuracy).
`ddnb.viz.widgets.compression.CompressionExplorer` is the widget that trains with a chosen
method and times it on a chosen emulated link.
Taught in `notebooks/14_precision_compression.ipynb`.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from ddnb.viz.memory import fmt_bytes


def plot_accuracy_vs_bytes(rows: list[dict], ax=None, title: str = ""):
    """Scatter of final_accuracy (%) against bytes_per_step, labelled by method."""
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    for i, r in enumerate(rows):
        ax.scatter(r["bytes_per_step"], 100 * r["final_accuracy"], color=f"C{i}", s=40, zorder=3)
        ax.annotate(r["method"], (r["bytes_per_step"], 100 * r["final_accuracy"]), textcoords="offset points",
                    xytext=(5, 4), fontsize=8)
    ax.set_xscale("log")
    ticks = sorted({r["bytes_per_step"] for r in rows})
    ax.set_xticks(ticks)
    ax.set_xticklabels([fmt_bytes(t) for t in ticks], rotation=45, fontsize=7)
    ax.minorticks_off()
    ax.set_xlabel("bytes one rank hands to the collectives per step")
    ax.set_ylabel("final test accuracy (%)")
    ax.grid(alpha=0.3)
    ax.set_title(title or "accuracy against bytes sent")
    return ax
