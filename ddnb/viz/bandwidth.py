"""All-reduce time and bus bandwidth against message size, one line per algorithm, with
the cost model's prediction dashed beside the measurement. Takes the rows of
`ddnb.bench.allreduce.allreduce_rows` (dicts with size, algorithm, time, busbw, and optionally
predicted_time).
Taught in `notebooks/05_allreduce.ipynb`.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from ddnb.viz.memory import fmt_bytes

ORDER = ("naive", "tree", "ring", "halving_doubling", "torch", "horovod")


def plot_allreduce_times(rows: list[dict], link_bw: float | None = None, axes=None, title: str = ""):
    """Left: time against size (log-log), measured (solid) and predicted (dashed).
    Right: bus bandwidth against size, with the point-to-point link's bandwidth as the ceiling."""
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(11, 4))
    ax_t, ax_bw = axes
    algorithms = [a for a in ORDER if any(r["algorithm"] == a for r in rows)]
    algorithms += sorted({r["algorithm"] for r in rows} - set(algorithms))
    for i, alg in enumerate(algorithms):
        rs = sorted((r for r in rows if r["algorithm"] == alg), key=lambda r: r["size"])
        color = f"C{i}"
        sizes = [r["size"] for r in rs]
        ax_t.plot(sizes, [r["time"] * 1e3 for r in rs], "o-", color=color, label=alg, ms=4)
        if any("predicted_time" in r for r in rs):
            pr = [r for r in rs if "predicted_time" in r]
            ax_t.plot([r["size"] for r in pr], [r["predicted_time"] * 1e3 for r in pr], "--", color=color, lw=1)
        ax_bw.plot(sizes, [r["busbw"] for r in rs], "o-", color=color, label=alg, ms=4)
    if link_bw:
        ax_bw.axhline(link_bw, color="black", ls=":", lw=1, label="p2p link")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ticks = sorted({r["size"] for r in rows})
        ax.set_xticks(ticks)
        ax.set_xticklabels([fmt_bytes(s) for s in ticks], rotation=45, fontsize=7)
        ax.set_xlabel("message size")
        ax.grid(alpha=0.3)
    ax_t.set_yscale("log")
    ax_t.set_ylabel("time (ms); dashed: alpha-beta model")
    ax_bw.set_ylabel("bus bandwidth (GB/s)")
    ax_bw.legend(fontsize=8)
    if title:
        ax_t.figure.suptitle(title)
    return axes


def plot_bytes_per_rank(measured: dict[str, list[float]], predicted: dict[str, list[float]] | None = None,
                        ax=None, title: str = ""):
    """Grouped bars: bytes sent by each rank, per algorithm; predicted values as black ticks."""
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3.2))
    algorithms = list(measured)
    n = max(len(v) for v in measured.values())
    width = 0.8 / max(1, len(algorithms))
    for i, alg in enumerate(algorithms):
        xs = [r + (i - (len(algorithms) - 1) / 2) * width for r in range(len(measured[alg]))]
        ax.bar(xs, [b / 2**20 for b in measured[alg]], width=width, label=alg, color=f"C{ORDER.index(alg) if alg in ORDER else i}")
        if predicted and alg in predicted:
            ax.plot(xs, [b / 2**20 for b in predicted[alg]], "k_", ms=12, mew=2)
    ax.set_xticks(range(n))
    ax.set_xticklabels([f"rank {r}" for r in range(n)])
    ax.set_ylabel("MB sent")
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    return ax
