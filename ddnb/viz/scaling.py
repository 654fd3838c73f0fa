"""How a measured time changes with the number of workers, and the scaling efficiency.

For a fixed amount of work (an epoch), with T(N) the time on N workers:
speedup S(N) = T(1) / T(N) and efficiency E(N) = S(N) / N (1 is perfect, linear scaling).
Taught in `notebooks/06_data_parallelism.ipynb` (and 00, 05 for the time alone)."""
from __future__ import annotations

import matplotlib.pyplot as plt

from ddnb._checks import Checks, is_int


def plot_time_vs_workers(times: dict[int, float], ax=None, title: str = "", unit: str = "ms",
                         label: str | None = None):
    """Line plot of {workers: seconds}, in `unit` (s, ms or us). Returns the Axes."""
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.2))
    ns = sorted(times)
    ax.plot(ns, [times[n] * scale for n in ns], "o-", label=label)
    ax.set_xlabel("workers")
    ax.set_ylabel(f"time ({unit})")
    ax.set_xticks(ns)
    ax.set_ylim(bottom=0)
    if title:
        ax.set_title(title)
    if label:
        ax.legend()
    ax.grid(alpha=0.3)
    return ax


def scaling_table(times: dict[int, float]) -> list[dict]:
    """Rows {workers, time, speedup, efficiency} from {workers: seconds for the same work},
    sorted by workers; speedup and efficiency are relative to 1 worker (None without it)."""
    with Checks("scaling_table") as check:
        check.rule(all(is_int(n) and n >= 1 for n in times), f"worker counts must be integers >= 1, got {list(times)}")
        for n, t in times.items():
            check.number(f"times[{n!r}]", t, positive=True, why=" (seconds)")
    base = times.get(1)
    return [{"workers": n, "time": times[n], "speedup": None if base is None else base / times[n],
             "efficiency": None if base is None else base / (n * times[n])} for n in sorted(times)]


def plot_scaling(times: dict[int, float], title: str = "", unit: str = "s", axes=None):
    """Two panels: the time for the same work against workers, and the efficiency
    T(1) / (N T(N)) against the ideal 1 (drawn once 1 worker is measured). Returns the axes."""
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    plot_time_vs_workers(times, ax=axes[0], title=title, unit=unit)
    rows = [r for r in scaling_table(times) if r["efficiency"] is not None]
    ax = axes[1]
    ax.axhline(1.0, color="k", lw=0.8, ls="--", label="linear scaling")
    if rows:
        ax.plot([r["workers"] for r in rows], [r["efficiency"] for r in rows], "o-", color="C1", label="measured")
    ax.set_xticks(sorted(times))
    ax.set_xlabel("workers")
    ax.set_ylabel("efficiency T(1) / (N T(N))")
    # every measured point stays on the chart (an efficiency above 1 is shown, not clipped)
    ax.set_ylim(0, max([1.2] + [1.1 * r["efficiency"] for r in rows]))
    ax.legend()
    ax.grid(alpha=0.3)
    return axes
