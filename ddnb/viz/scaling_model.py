"""Plots of the predicted step time at scale (`ddnb.cost.scaling`), and a widget to vary
the model, the network and the algorithms. Plots take plain data: {label: {N: seconds}}.
Taught in `notebooks/12_scalability.ipynb`."""
from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import display

from ddnb.viz.png import figure_png

LABELS = {"ps_central": "central PS", "ps_sharded": "sharded PS", "tree": "tree", "ring": "ring",
          "halving_doubling": "halving-doubling", "hierarchical": "hierarchical (8/node)", "torus2d": "2D torus"}


def _log2_workers(ax, workers) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(workers)
    ax.set_xticklabels([str(n) for n in workers], rotation=45)
    ax.set_xlabel("workers N")
    ax.grid(alpha=0.3, which="both")


def _plot_curves(curves: dict[str, dict[int, float]], ax, ylabel: str, title: str, line: float | None = None,
                 line_label: str | None = None, legend_loc: str = "best"):
    """Lines of {algorithm: {N: value}} against N (log2), and `line` dashed across. Returns the Axes."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.8))
    workers = sorted({n for c in curves.values() for n in c})
    for name, values in curves.items():
        ns = sorted(values)
        ax.plot(ns, [values[n] for n in ns], "o-", ms=3, label=LABELS.get(name, name))
    if line is not None:
        ax.axhline(line, color="k", ls="--", lw=0.8, label=line_label)
    ax.set_ylabel(ylabel)
    _log2_workers(ax, workers)
    if title:
        ax.set_title(title)
    ax.legend(fontsize=7, loc=legend_loc)
    return ax


def plot_step_times(curves: dict[str, dict[int, float]], compute_time: float | None = None, ax=None,
                    title: str = "", ylabel: str = "seconds per step"):
    """Log-log lines of {algorithm: {N: seconds}}; the compute time alone dashed. Returns the Axes."""
    ax = _plot_curves(curves, ax, ylabel, title, compute_time, "compute alone")
    ax.set_yscale("log")
    return ax


def plot_efficiency(curves: dict[str, dict[int, float]], ax=None, title: str = ""):
    """Lines of {algorithm: {N: efficiency in [0, 1]}} against N (log2). Returns the Axes."""
    ax = _plot_curves(curves, ax, "scaling efficiency T(1)/T(N)", title, 1.0, legend_loc="lower left")
    ax.set_ylim(0, 1.05)
    return ax


def plot_predicted_vs_measured(measured: dict[str, dict[int, float]], predicted: dict[str, dict[int, float]],
                               ax=None, title: str = "", unit: str = "ms"):
    """Measured (markers) and predicted (dashed) {label: {N: seconds}} on a linear N axis."""
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.5))
    for i, name in enumerate(measured):
        ns = sorted(measured[name])
        ax.plot(ns, [measured[name][n] * scale for n in ns], "o-", color=f"C{i}", label=f"{name} measured")
        if name in predicted:
            ps = sorted(predicted[name])
            ax.plot(ps, [predicted[name][n] * scale for n in ps], "--", color=f"C{i}", label=f"{name} model")
    ax.set_xlabel("workers N")
    ax.set_ylabel(f"time ({unit})")
    ax.set_xticks(sorted({n for c in measured.values() for n in c}))
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title)
    ax.legend(fontsize=7)
    return ax


def plot_emulated_scaling(rows: list[dict], title: str = "", ax=None):
    """Weak-scaling efficiency T(1)/T(N) per strategy from `ddnb.bench.dp.dp_scaling`'s
    rows: the emulated run as markers, `ddnb.cost.dp_step`'s model as lines. Returns the Axes."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.8))
    strategies = sorted({r["strategy"] for r in rows})
    workers = sorted({r["workers"] for r in rows})
    for k, s in enumerate(strategies):
        mine = sorted((r for r in rows if r["strategy"] == s), key=lambda r: r["workers"])
        color = f"C{k}"
        ax.plot([r["workers"] for r in mine], [r["model_efficiency"] for r in mine], "-", color=color,
                label=f"{s}: model")
        ax.plot([r["workers"] for r in mine], [r["efficiency"] for r in mine], "o", color=color,
                label=f"{s}: emulated run")
    _log2_workers(ax, workers)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("efficiency T(1) / T(N)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    return ax


class ScalingExplorer:
    """Choose a model (num_params, bytes_per_param, compute seconds per step), a network
    (or type its bandwidth and latency) and algorithms; draws the predicted step time and
    the scaling efficiency from 8 to 4,096 workers. Errors are shown in the widget.

        ScalingExplorer(models={"ResNet-50 fp32": (25.6e6, 4, 0.1)}, networks=NETWORKS)
    """

    def __init__(self, models: dict, networks: dict, algorithms=None, workers=None, **step_kwargs):
        from ddnb.cost.scaling import STEP_ALGORITHMS

        if not models or not networks:
            raise ValueError(f"need at least one model and one network, got {len(models)} and {len(networks)}")
        self.models, self.networks, self.step_kwargs = dict(models), dict(networks), step_kwargs
        self.workers = list(workers or [2 ** k for k in range(3, 13)])
        chosen = list(algorithms or STEP_ALGORITHMS)
        self.model = widgets.Dropdown(options=list(self.models), description="model")
        self.network = widgets.Dropdown(options=list(self.networks), description="network")
        first = self.networks[self.network.value]
        self.bandwidth = widgets.FloatText(value=first.bandwidth * 8 / 1e9, description="Gb/s")
        self.latency = widgets.FloatText(value=first.alpha * 1e6, description="latency us")
        self.algorithms = widgets.SelectMultiple(options=list(STEP_ALGORITHMS), value=chosen, rows=7,
                                                 description="algorithms")
        self.status = widgets.Label()
        self.image = widgets.Image(format="png")
        self.network.observe(self._network_chosen, names="value")
        for w in (self.model, self.bandwidth, self.latency, self.algorithms):
            w.observe(lambda change: self.redraw(), names="value")
        controls = widgets.VBox([self.model, self.network, self.bandwidth, self.latency])
        self.widget = widgets.VBox([widgets.HBox([controls, self.algorithms]), self.status, self.image])
        self.redraw()

    def _network_chosen(self, change) -> None:
        net = self.networks[change["new"]]
        with self.bandwidth.hold_trait_notifications(), self.latency.hold_trait_notifications():
            self.bandwidth.value, self.latency.value = net.bandwidth * 8 / 1e9, net.alpha * 1e6
        self.redraw()

    def curves(self):
        """(step times, efficiencies, compute seconds) for the current choices; raises on bad input."""
        from ddnb.cost.scaling import efficiency, network, step_times

        if not self.algorithms.value:
            raise ValueError("choose at least one algorithm")
        num_params, bytes_per_param, compute = self.models[self.model.value]
        net = network(self.bandwidth.value, self.latency.value)
        times = step_times(self.algorithms.value, self.workers, num_params, compute, net,
                           bytes_per_param=bytes_per_param, **self.step_kwargs)
        return times, {a: efficiency(t, compute) for a, t in times.items()}, compute

    def redraw(self) -> None:
        try:
            times, eff, compute = self.curves()
        except Exception as e:  # noqa: BLE001 - shown to the learner, never a traceback
            self.status.value = f"{type(e).__name__}: {e}"
            return
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        title = f"{self.model.value}, {self.bandwidth.value:g} Gb/s, {self.latency.value:g} us"
        plot_step_times(times, compute, ax=axes[0], title=title)
        plot_efficiency(eff, ax=axes[1], title="weak scaling efficiency")
        fig.tight_layout()
        self.image.value = figure_png(fig)
        self.status.value = f"{len(times)} algorithms, {self.workers[0]} to {self.workers[-1]} workers"

    def _ipython_display_(self):
        display(self.widget)
