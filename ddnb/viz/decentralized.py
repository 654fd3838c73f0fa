"""Plots of decentralized runs (accuracy and consensus distance against steps and against
bytes per worker), from the per-rank stats the runs return; the widget that re-runs
D-PSGD / AD-PSGD on the cluster is `ddnb.viz.widgets.decentralized.DecentralizedExplorer`.
Taught in `notebooks/05b_decentralized.ipynb`.
"""
from __future__ import annotations

import matplotlib.pyplot as plt


def curves(results: list[dict]) -> dict:
    """From one run's per-rank stats: steps, accuracy, consensus (rank 0's measurements, the
    same on every rank) and the mean bytes a worker had sent at each measured step
    (bytes_sent spread evenly over the steps)."""
    r0, n = results[0], len(results)
    per_step = sum(r["bytes_sent"] for r in results) / n / r0["steps"]
    m = r0["measured"]
    return {"steps": [e["step"] for e in m], "accuracy": [e["accuracy"] for e in m],
            "consensus": [e["consensus"] for e in m], "bytes": [e["step"] * per_step for e in m]}


def plot_runs(runs: dict[str, list[dict]], axes=None, title: str = ""):
    """Three panels: test accuracy of the workers' mean vs steps, vs bytes sent per worker
    (MB), and the consensus distance vs steps (log scale), one line per run."""
    if axes is None:
        _, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for name, results in runs.items():
        c = curves(results)
        axes[0].plot(c["steps"], c["accuracy"], marker=".", label=name)
        axes[1].plot([b / 1e6 for b in c["bytes"]], c["accuracy"], marker=".", label=name)
        axes[2].plot(c["steps"], [max(v, 1e-9) for v in c["consensus"]], marker=".", label=name)
    axes[0].set(xlabel="step", ylabel="test accuracy of the mean", title=title or "accuracy vs steps")
    axes[1].set(xlabel="MB sent per worker", ylabel="test accuracy", title="accuracy vs bytes")
    axes[2].set(xlabel="step", ylabel="consensus distance", yscale="log", title="spread of the workers")
    axes[0].legend(fontsize=8)
    axes[0].figure.tight_layout()
    return axes
