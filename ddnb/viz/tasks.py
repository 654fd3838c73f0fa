"""Pictures of task parallelism (`ddnb.tasks`): which engine ran which task when, a
hyperparameter search as points coloured by their score, and an ensemble against its
members. Each takes plain data (lists of dicts and floats). Taught in
`notebooks/02_task_parallelism.ipynb`."""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

STATUS_COLORS = {"ok": "#4c72b0", "error": "#c44e52", "timeout": "#dd8452"}


def plot_task_timeline(tasks: list[dict], ax=None, title: str = ""):
    """One row per engine, one bar per task from start to end (seconds), coloured by status
    and labelled with the task's index. `tasks`: dicts with engine, start, end, status,
    index (see `ddnb.tasks.task_events`). Returns the Axes."""
    tasks = [t for t in tasks if t.get("start") is not None and t.get("end") is not None
             and t.get("engine") is not None]
    engines = sorted({t["engine"] for t in tasks})
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.8 + 0.5 * max(1, len(engines))))
    row = {e: i for i, e in enumerate(engines)}
    for t in tasks:
        width = max(t["end"] - t["start"], 1e-3)
        ax.barh(row[t["engine"]], width, left=t["start"], height=0.7,
                color=STATUS_COLORS.get(t["status"], "#999999"), edgecolor="white")
        ax.text(t["start"] + width / 2, row[t["engine"]], str(t["index"]), ha="center", va="center",
                fontsize=7, color="white")
    ax.set_yticks(range(len(engines)))
    ax.set_yticklabels([f"engine {e}" for e in engines])
    ax.set_ylim(len(engines) - 0.5, -0.5)
    ax.set_xlabel("seconds since submission")
    statuses = [s for s in STATUS_COLORS if any(t["status"] == s for t in tasks)]
    ax.legend(handles=[Patch(color=STATUS_COLORS[s], label=s) for s in statuses], loc="upper left",
              bbox_to_anchor=(1.0, 1.0), fontsize=8)
    if title:
        ax.set_title(title)
    return ax


def plot_search(rows: list[dict], x: str, y: str, value: str, ax=None, title: str = "", logx: bool = True,
                logy: bool = True, vmin: float | None = None, vmax: float | None = None):
    """Each configuration of a search as a point at (row[x], row[y]) coloured by row[value];
    the best is circled. Rows without a value (failed tasks) are grey crosses where they can
    be placed (a log axis has no place for hidden=0), and counted in the title either way.
    Returns the Axes."""
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.6))
    done = [r for r in rows if r.get(value) is not None and r[value] == r[value]]   # drop None / NaN
    failed = [r for r in rows if r not in done]
    sc = ax.scatter([r[x] for r in done], [r[y] for r in done], c=[r[value] for r in done], cmap="viridis",
                    vmin=vmin, vmax=vmax, s=60, edgecolors="k", linewidths=0.4)
    placeable = [r for r in failed if isinstance(r.get(x), (int, float)) and isinstance(r.get(y), (int, float))
                 and (r[x] > 0 or not logx) and (r[y] > 0 or not logy)]
    if placeable:
        ax.scatter([r[x] for r in placeable], [r[y] for r in placeable], marker="x", color="grey")
    if failed:
        title = f"{title} ({len(failed)} failed)" if title else f"{len(failed)} failed"
    if done:
        best = max(done, key=lambda r: r[value])
        ax.scatter([best[x]], [best[y]], s=220, facecolors="none", edgecolors="r", linewidths=1.5)
    ax.figure.colorbar(sc, ax=ax, label=value)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log", base=2)
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    if title:
        ax.set_title(title)
    return ax


def plot_ensemble(single: list[float], ensemble: dict[str, float], ax=None, title: str = "",
                  label: str = "test accuracy", names: list[str] | None = None):
    """Bars: each member's score; horizontal lines: the ensemble's, one per combining
    method ({"mean of softmax": 0.98, ...}); `names` label the bars (default "model i").
    The y axis is zoomed to where they differ.
    Returns the Axes."""
    if not single:
        raise ValueError("plot_ensemble needs at least one member's score")
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.2))
    ax.bar(range(len(single)), single, color="#8da0cb", label="single models")
    styles = ["-", "--", ":", "-."]
    for i, (name, v) in enumerate(ensemble.items()):
        ax.axhline(v, color="#c44e52", ls=styles[i % len(styles)], label=f"ensemble ({name})")
    low = min(list(single) + list(ensemble.values()))
    high = max(list(single) + list(ensemble.values()))
    pad = max(0.005, 0.5 * (high - low))
    ax.set_ylim(low - pad, min(1.0, high + pad) if high <= 1 else high + pad)
    ax.set_xticks(range(len(single)))
    ax.set_xticklabels(names if names is not None else [f"model {i}" for i in range(len(single))])
    ax.set_ylabel(label)
    ax.legend(fontsize=8, loc="lower right")
    if title:
        ax.set_title(title)
    return ax
