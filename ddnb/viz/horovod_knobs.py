"""Runs of Horovod's tensor-fusion knobs, drawn from the plain dicts
`ddnb.bench.horovod_knobs.measure_knobs` returns: the measured step time and the fused
all-reduces per step read from Horovod's timeline (`plot_knob_runs`), each run labelled by
its knobs (`knob_label`). The widget that measures them on the cluster is
`ddnb.viz.widgets.horovod_knobs.HorovodKnobs`. Taught in `notebooks/07_horovod.ipynb`.
"""
from __future__ import annotations

import matplotlib.pyplot as plt


def knob_label(run: dict) -> str:
    """"fusion 64 KB, cycle 5 ms, fp16" for a run's knobs (defaults named as such)."""
    f, c = run["fusion_mb"], run["cycle_ms"]
    fusion = "default" if f is None else "off" if f == 0 else f"{f * 1024:g} KB" if f < 1 else f"{f:g} MB"
    cycle = "default" if c is None else f"{c:g} ms"
    return f"fusion {fusion}, cycle {cycle}" + (", fp16" if run["fp16"] else "")


def plot_knob_runs(runs: list[dict], cores: int | None = None):
    """Two panels, one bar per run (the dicts `measure_knobs` returns): step time (ms) and
    fused all-reduces per step (with the gradient tensors per step marked). Returns the
    Figure."""
    if not runs:
        raise ValueError("runs is empty: measure at least one setting")
    labels = [knob_label(r) for r in runs]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 0.9 + 0.4 * len(runs)), sharey=True)
    ys = list(range(len(runs)))
    ax1.barh(ys, [r["step_time"] * 1e3 for r in runs], color="C1")
    where = f"{runs[0]['workers']} workers" + (f" on {cores} cores" if cores else "")
    ax1.set_xlabel(f"step time (ms), real processes: {where}")
    ax2.barh(ys, [r["allreduces_per_step"] for r in runs], color="C0")
    ax2.axvline(runs[0]["tensors"], color="k", lw=0.8, ls=":")
    ax2.text(runs[0]["tensors"], len(runs) - 0.5, f" {runs[0]['tensors']} tensors", fontsize=8, va="bottom")
    ax2.set_xlabel("fused all-reduces per step")
    ax1.set_yticks(ys)
    ax1.set_yticklabels(labels, fontsize=8)
    ax1.invert_yaxis()
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    return fig
