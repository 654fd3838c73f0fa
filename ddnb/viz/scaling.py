"""How a measured time changes with the number of workers."""
from __future__ import annotations

import matplotlib.pyplot as plt


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
