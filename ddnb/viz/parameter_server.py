"""Plots of parameter-server runs (Li et al. 2014, "Scaling Distributed Machine Learning
with the Parameter Server", OSDI), from the plain dicts `ddnb.parameter_server.train`
returns on each rank and the traffic counted from traces (`parameter_server.traffic`).
They draw and never train: `ddnb.viz.widgets.parameter_server.ParameterServerExplorer`'s
Run button calls the function it is given (`ddnb.parameter_server.train_on_cluster` in the
notebook) and draws what it returns with them.
Taught in `notebooks/04_parameter_server.ipynb`.
"""
from __future__ import annotations

import matplotlib.pyplot as plt


def plot_traffic(traffic: dict, steps: int, servers: int, ax=None, title: str = ""):
    """Megabytes each rank sent and received per step; server ranks (0..servers-1) hatched."""
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3))
    n = len(traffic["sent"])
    xs = range(n)
    sent = [b / steps / 2**20 for b in traffic["sent"]]
    received = [b / steps / 2**20 for b in traffic["received"]]
    hatch = ["//" if r < servers else "" for r in xs]
    for r in xs:
        ax.bar(r - 0.2, sent[r], width=0.4, color="#dd8452", hatch=hatch[r], label="sent" if r == 0 else None)
        ax.bar(r + 0.2, received[r], width=0.4, color="#55a868", hatch=hatch[r], label="received" if r == 0 else None)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([f"{'server' if r < servers else 'worker'}\nrank {r}" for r in xs], fontsize=8)
    ax.set_ylabel("MB per step")
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    return ax


def server_history(results: list[dict]) -> list[dict]:
    """The update history of the (first) server rank: [{time, version, loss}]."""
    for r in results:
        if r.get("history"):
            return r["history"]
    return []


def applied(results: list[dict]) -> list[dict]:
    """Every gradient the servers applied: [{worker, staleness, time, ...}]."""
    return [a for r in results for a in r.get("applied", [])]


def plot_convergence(runs: dict[str, list[dict]], axes=None, title: str = ""):
    """Training loss against wall time (left) and against server updates (right), one
    line per run; `runs` maps a label to the list `train` returned on every rank."""
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(11, 3.5))
    for i, (label, results) in enumerate(runs.items()):
        hist = [h for h in server_history(results) if h.get("loss") == h.get("loss")]  # drop NaN
        axes[0].plot([h["time"] for h in hist], [h["loss"] for h in hist], color=f"C{i}", label=label, lw=1)
        axes[1].plot([h["version"] for h in hist], [h["loss"] for h in hist], color=f"C{i}", label=label, lw=1)
    axes[0].set_xlabel("wall time (s)")
    axes[1].set_xlabel("server updates (version)")
    for ax in axes:
        ax.set_ylabel("training loss")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        axes[0].figure.suptitle(title)
    return axes


def plot_staleness(runs: dict[str, list[dict]], ax=None, title: str = ""):
    """Histogram of the staleness of every applied gradient (server version at apply time
    minus the version the worker computed on), one group of bars per run."""
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3))
    labels = list(runs)
    values = {label: [a["staleness"] for a in applied(runs[label])] for label in labels}
    top = max((max(v) for v in values.values() if v), default=0)
    width = 0.8 / max(1, len(labels))
    for i, label in enumerate(labels):
        v = values[label]
        counts = [v.count(s) / max(1, len(v)) for s in range(top + 1)]
        ax.bar([s + (i - (len(labels) - 1) / 2) * width for s in range(top + 1)], counts, width=width,
               label=label, color=f"C{i}")
    ax.set_xlabel("staleness (versions behind)")
    ax.set_ylabel("fraction of gradients")
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    return ax


def plot_saturation(result: dict, ax=None, title: str = ""):
    """Step time against workers from `ddnb.bench.parameter_server.server_vs_ring`:
    one line per strategy (1, 2, ... servers; the ring), the run as points and, when
    emulated, the model as a dashed line of the same colour. Returns the Axes."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.5))
    groups = {}
    for r in result["rows"]:
        name = f"{r['servers']} server{'s' if r['servers'] > 1 else ''}" if r["strategy"] == "server" else "ring all-reduce"
        groups.setdefault(name, []).append(r)
    for name, rows in groups.items():
        ns = [r["workers"] for r in rows]
        line, = ax.plot(ns, [r["step_time"] * 1e3 for r in rows], "o", label=f"{name} (run)")
        if "model_step_time" in rows[0]:
            ax.plot(ns, [r["model_step_time"] * 1e3 for r in rows], "--", color=line.get_color(), label=f"{name} (model)")
    emulated = "model_step_time" in result["rows"][0]
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({r["workers"] for r in result["rows"]}))
    ax.get_xaxis().set_major_formatter(plt.ScalarFormatter())
    ax.set_xlabel("workers")
    ax.set_ylabel(f"step time ({'emulated ' if emulated else ''}ms)")
    ax.set_title(title or result["profile"].split(";")[0], fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return ax
