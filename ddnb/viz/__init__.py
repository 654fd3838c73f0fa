"""Plots and widgets. Each plot is one function that takes plain data (lists, dicts), so
it can be drawn and tested without a cluster."""
from ddnb.viz.scaling import plot_time_vs_workers
from ddnb.viz.widgets import WorkerCountExplorer

__all__ = ["plot_time_vs_workers", "WorkerCountExplorer"]
