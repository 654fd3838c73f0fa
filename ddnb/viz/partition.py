"""Per-rank compute, idle fraction and memory of one cut of a model's layers into stages,
from the plain dict `ddnb.viz.widgets.partition_explorer.measure_partition` returns (the
widget that runs the cut on the cluster is `ddnb.viz.widgets.partition_explorer.PartitionExplorer`).
Taught in `notebooks/08_model_parallelism.ipynb`.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from ddnb.viz.memory import plot_memory


def plot_partition(result: dict, reference_memory: dict | None = None, cores: int | None = None):
    """Two panels from a `measure_partition` dict: compute per rank (ms) with each rank's
    idle fraction written on its bar, and memory per rank (`plot_memory`, beside one
    process's when `reference_memory` is given). Returns the Figure."""
    p = len(result["compute"])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.2))
    ms = [c * 1e3 for c in result["compute"]]
    ax1.bar(range(p), ms, width=0.6, color="#4c72b0")
    for r, (m, idle) in enumerate(zip(ms, result["idle"])):
        ax1.text(r, m, f"idle {idle:.0%}", ha="center", va="bottom", fontsize=8)
    ax1.set_xticks(range(p))
    ax1.set_xticklabels([f"rank {r}\n{tuple(b)}" for r, b in enumerate(result["bounds"])], fontsize=8)
    ax1.set_ylabel("compute per step (ms)")
    ax1.set_ylim(0, 1.2 * max(ms, default=1) or 1)
    where = f", real processes on {cores} cores" if cores else ""
    ax1.set_title(f"step {result['step'] * 1e3:.1f} ms{where}", fontsize=9)
    bars = ([reference_memory] if reference_memory else []) + list(result["memory"])
    labels = (["1 process"] if reference_memory else []) + [f"rank {r}" for r in range(p)]
    plot_memory(bars, ax=ax2, unit="KB", labels=labels, title="memory per rank")
    fig.tight_layout()
    return fig
