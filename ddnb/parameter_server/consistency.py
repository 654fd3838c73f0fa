"""When may a worker go on? The three consistency models of a parameter server, as one rule.

Every worker w has a clock c_w: the number of gradients the server has received from it
(its step). A worker asking for parameters ("pull") for its step c_w is answered only when

    c_w - min_{w' live} c_w'  <=  bound                                          (1)

    mode   bound   the server applies ...
    bsp    0       the average of the N gradients of a step, once all N are in
    ssp    s       each gradient as it arrives
    asp    inf     each gradient as it arrives

Rule (1) with bound s is the stale synchronous parallel model of Ho et al. 2013, "More
Effective Distributed ML via a Stale Synchronous Parallel Parameter Server" (NIPS), Sec. 2:
the fastest worker may be at most s clocks ahead of the slowest. BSP (Valiant's bulk
synchronous parallel) and ASP (fully asynchronous, as in Li et al. 2014, OSDI, Sec. 3.3's
"eventual" consistency) are its two ends, s = 0 and s = infinity. Lost workers leave the
min; finished ones too.

Staleness of an applied gradient = (server version when applied) - (version it was
computed on): the number of updates it did not see. What (1) guarantees, N workers:

  * a gradient of clock c was computed on parameters that hold every gradient of clocks
    < c - s from every worker: version read >= N·(c - s) (for ssp/asp with one update per
    gradient, from the start of a run);
  * staleness <= (N - 1)(2s + 1): between the read and the apply of w's gradient, another
    worker w' moves from clock >= c - s to clock <= c + s + 1 (it can be granted clock
    c + s at most while w is still at c), so it pushes at most 2s + 1 gradients.
    With s = 0 that is N - 1: each other worker at most one gradient ahead (lock-step).

Taught in `notebooks/04_parameter_server.ipynb`.
"""
from __future__ import annotations

import math

MODES = ("bsp", "asp", "ssp")


def bound(mode: str, staleness: int = 0) -> float:
    """The bound of rule (1): 0 for bsp, `staleness` for ssp, infinity for asp."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is not one of {MODES}")
    return {"bsp": 0, "ssp": staleness, "asp": math.inf}[mode]


def may_proceed(clock: int, clocks: dict, live, limit: float) -> bool:
    """Rule (1): may the worker at `clock` get parameters, given every worker's clock and
    the live ones (those that count for the slowest)? True when no worker is live."""
    slowest = min((clocks[w] for w in live), default=clock)
    return clock - slowest <= limit


def staleness_bound(workers: int, staleness: int) -> int:
    """The largest staleness SSP(s) allows with `workers` workers: (N - 1)(2s + 1)."""
    return (workers - 1) * (2 * staleness + 1)
