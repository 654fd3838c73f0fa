"""ddnb: distributed deep-learning training, built step by step in notebooks.

What a learner types in a notebook is re-exported here; the rest is reached by its module
path (ddnb.testing, ddnb.viz, ...). Imports are lazy, so worker processes that only need
`ddnb.runtime.worker` do not pay for ipyparallel or matplotlib.
Taught from `notebooks/00_getting_started.ipynb` on.
"""
__version__ = "0.1.0"

_EXPORTS = {
    "Cluster": "ddnb.runtime.cluster",
    "LostWorker": "ddnb.runtime.waiting",
    "ClusterError": "ddnb.runtime.errors",
    "WorkerError": "ddnb.runtime.errors",
    "WorkerLostError": "ddnb.runtime.errors",
    "WorkerTimeoutError": "ddnb.runtime.errors",
    "ProcessGrid": "ddnb.process_grid",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'ddnb' has no attribute {name!r}")
