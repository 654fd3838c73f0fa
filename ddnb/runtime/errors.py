"""The errors a distributed run raises instead of hanging: each names the ranks involved.
Shared by `ddnb.runtime.cluster` (ipyparallel engines) and `ddnb.runtime.world` (forked processes).
Taught in `notebooks/00_getting_started.ipynb`.
"""
from __future__ import annotations


class ClusterError(RuntimeError):
    """Something went wrong on one or more ranks."""


class WorkerError(ClusterError):
    """A function raised on a rank; the message holds the rank and its traceback."""

    def __init__(self, rank: int, message: str):
        super().__init__(message)
        self.rank = rank


class WorkerLostError(ClusterError):
    """A worker process died (killed, crashed, out of memory) while we waited for it."""

    def __init__(self, ranks: list[int], message: str):
        super().__init__(message)
        self.ranks = ranks


class WorkerTimeoutError(ClusterError, TimeoutError):
    """Ranks that did not answer within the timeout."""

    def __init__(self, ranks: list[int], message: str):
        super().__init__(message)
        self.ranks = ranks
