"""Waiting on the engines with a deadline: one AsyncResult per rank, and as soon as a rank
raises, dies or runs out of time, an error that names it (`WorkerError`,
`WorkerLostError`, `WorkerTimeoutError`). Nothing waits without a deadline. Used by
`ddnb.runtime.cluster`; taught in `notebooks/00_getting_started.ipynb` and (lost workers)
`notebooks/04_parameter_server.ipynb`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import ipyparallel as ipp
import psutil

from ddnb.runtime.errors import WorkerError, WorkerLostError, WorkerTimeoutError


@dataclass(frozen=True)
class LostWorker:
    """What `Cluster.run_surviving` returns for a rank whose process died."""
    rank: int
    where: str

    def __str__(self) -> str:
        return f"rank {self.rank} lost ({self.where})"


def await_ranks(ars, engine_ids, ranks_of: dict, what: str, timeout: float, is_dead, where,
                allow_lost: bool = False) -> list:
    """Wait for `ars` (one per engine of `engine_ids`); raise as soon as a rank fails or
    dies. With allow_lost, a dead rank's result is a LostWorker and the others are waited
    for. is_dead(engine_id) and where(engine_id) come from the cluster."""
    deadline = time.monotonic() + timeout
    label = lambda k: (f"rank {ranks_of[engine_ids[k]]}" if engine_ids[k] in ranks_of
                       else f"engine {engine_ids[k]}")
    while True:
        pending, failed = [], []
        for k, ar in enumerate(ars):
            if not ar.ready():
                pending.append(k)
            elif not ar.successful():
                failed.append(k)
        # a task that failed because its engine died (ipyparallel's EngineError) is a lost worker
        dead = [k for k in pending + failed if is_dead(engine_ids[k]) or engine_error(ars[k])]
        for k in failed:
            if k not in dead:
                raise_remote(ars[k], label(k), what, ranks_of.get(engine_ids[k], -1),
                             still_running=[label(j) for j in pending])
        if allow_lost and all(k in dead for k in pending):
            return [LostWorker(ranks_of.get(engine_ids[k], -1), where(engine_ids[k])) if k in dead
                    else ar.get() for k, ar in enumerate(ars)]
        if not pending and not dead:
            return [ar.get() for ar in ars]
        if dead and not allow_lost:
            names = ", ".join(f"{label(k)} ({where(engine_ids[k])})" for k in dead)
            raise WorkerLostError([ranks_of.get(engine_ids[k], -1) for k in dead],
                                  f"{names} died while running {what}; the other ranks may be blocked "
                                  f"in a collective: call cluster.restart()")
        left = deadline - time.monotonic()
        if left <= 0:
            names = ", ".join(label(k) for k in pending)
            raise WorkerTimeoutError([ranks_of.get(engine_ids[k], -1) for k in pending],
                                     f"{names} did not finish {what} within {timeout:.0f} s "
                                     f"({len(ars) - len(pending)} of {len(ars)} finished); call cluster.restart()")
        ars[next((k for k in pending if k not in dead), pending[0])].wait(min(0.05, left))


def engine_error(ar) -> bool:
    """True when ipyparallel failed this task because its engine died."""
    if not ar.ready() or ar.successful():
        return False
    try:
        ar.get(0)
    except ipp.error.EngineError:
        return True
    except ipp.error.RemoteError as e:
        return e.ename == "EngineError"
    except Exception:
        return False
    return False


def raise_remote(ar, label, what, rank, still_running=()):
    """Raise WorkerError for a task that raised. `still_running`: the labels of the ranks
    whose part has not returned; they may be blocked waiting for this one, and the next
    call would queue behind them until its deadline, so the message says so."""
    blocked = (f"\n({', '.join(still_running)} still running {what}: possibly blocked waiting for "
               f"{label}; if the next call times out, call cluster.restart())" if still_running else "")
    try:
        ar.get()
    except ipp.error.RemoteError as e:
        tb = getattr(e, "traceback", "") or ""
        raise WorkerError(rank, f"{label} raised {e.ename}: {e.evalue}{blocked}\n"
                                f"--- remote traceback ({label}) ---\n{tb}") from None
    except Exception as e:  # EngineError and the like
        raise WorkerError(rank, f"{label} failed while running {what}: {e}") from None


def pid_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
