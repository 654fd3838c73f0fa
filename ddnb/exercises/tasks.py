"""Checker for the task-parallelism chapter (02): the learner's load-balanced map, run on
the notebook's ipyparallel view with real engines: every task submitted before any is
waited for (so free engines take them at once), the results in submission order.
Taught in `notebooks/02_task_parallelism.ipynb`.

    def my_map(view, fn, items):
        pending = [view.apply_async(fn, x) for x in items]    # submit them all
        return [p.get() for p in pending]                     # then wait, in order
    check_task_map(my_map, view)
"""
from __future__ import annotations

import time

from ddnb._checks import Checks
from ddnb.exercises.core import passed

SLEEP_S = 0.2       # each probe task waits this long (no CPU: the engines' cores do not matter)


def probe(x: int) -> dict:
    """The checker's task: x², where (pid) and when (start, end) it ran, after SLEEP_S."""
    import os
    import time

    start = time.time()
    time.sleep(SLEEP_S if x % 3 else 2 * SLEEP_S)        # uneven: every third task takes twice as long
    return {"value": x * x, "pid": os.getpid(), "start": start, "end": time.time()}


def check_task_map(map_fn, view, n_tasks: int = 8, timeout: float = 60) -> str:
    """Run `map_fn(view, probe, list(range(n_tasks)))` on the engines of `view` (an
    ipyparallel view) and check: one result per item, in submission order, and (with 2 or
    more engines) at least two tasks running at the same time. Returns the success line,
    else AssertionError with a hint."""
    with Checks("check_task_map") as check:
        check.rule(callable(map_fn), f"map_fn={map_fn!r}: need a function map_fn(view, fn, items)")
        check.rule(hasattr(view, "apply_async"), f"view={view!r}: need an ipyparallel view "
                                                 f"(cluster.client.load_balanced_view())")
        check.integer("n_tasks", n_tasks, min=2, max=64)
    items = list(range(n_tasks))
    t0 = time.monotonic()
    got = map_fn(view, probe, items)
    wall = time.monotonic() - t0
    if not isinstance(got, (list, tuple)):
        raise AssertionError(f"{getattr(map_fn, '__name__', 'map_fn')} returned {type(got).__name__}: return a list "
                             f"of the tasks' results, one per item")
    got = list(got)
    if got and hasattr(got[0], "get") and not isinstance(got[0], dict):
        raise AssertionError("the results are AsyncResults (tickets), not values: call .get() on each")
    if len(got) != n_tasks:
        raise AssertionError(f"{len(got)} results for {n_tasks} items: one result per item")
    values = [r["value"] if isinstance(r, dict) else r for r in got]
    expected = [x * x for x in items]
    if values != expected:
        i = next(k for k, (a, b) in enumerate(zip(values, expected)) if a != b)
        hint = ("the results are in the order the tasks finished, not the order they were submitted: keep the "
                "AsyncResults in a list and get() them in that order" if sorted(values) == expected
                else "every item's result, fn(item), in the items' order")
        raise AssertionError(f"result {i}: expected fn({i}) = {expected[i]}, got {values[i]!r}. {hint}")
    targets = getattr(view, "targets", None)
    engines = len(targets) if isinstance(targets, (list, tuple)) else 1 if isinstance(targets, int) else len(view.client.ids)
    spans = sorted((r["start"], r["end"]) for r in got)
    overlapped = any(b[0] < a[1] for a, b in zip(spans, spans[1:]))
    if engines > 1 and not overlapped:
        raise AssertionError(f"the {n_tasks} tasks ran one at a time ({wall:.1f} s) on {engines} engines: each was "
                             f"waited for before the next was submitted (apply_sync, or get() inside the loop). "
                             f"Submit them all with apply_async first, then get() the results")
    return passed("check_task_map", f"{n_tasks} results in submission order, "
                                    f"{'tasks ran side by side' if engines > 1 else 'on one engine'}")
