"""Task parallelism: many independent jobs (a hyperparameter search, an ensemble) spread over
the engines by ipyparallel's load-balanced view. No worker talks to another; each task is
one ordinary single-process training, so this needs no torch.distributed at all. The jobs
themselves (search spaces, the digits training, ensembles) are in `ddnb.search`.

    configs = grid(lr=[0.01, 0.1, 0.5], hidden=[16, 64])           # ddnb.search: 6 configurations
    view = cluster.client.load_balanced_view()
    results = run_tasks(view, train_digits_task, configs, timeout=60)
    results_table(results)                                       # one row per task (a DataFrame)

`run_tasks` submits every task at once; the scheduler hands each to whichever engine is
free (ipyparallel's TaskScheduler, high-water mark 1: one task per engine at a time), so a
slow task does not hold up the queue behind it. The speedup over one engine is at most the
number of engines, and at most the number of free cores: on this 2-core machine, 4 engines
run no faster than 2. A task that raises is reported (its config, error type and message)
while the others finish; a task still running `timeout` seconds after it started is stopped
on its engine (a SIGALRM timer set when the task starts raises TaskTimeoutError in it) and
reported as timed out, so the engine is free for the next task; one that ignores that is
interrupted from here (SIGINT to its engine) a little later. Taught in
`notebooks/02_task_parallelism.ipynb`.
"""
from __future__ import annotations

import contextlib
import math
import signal
import time
from dataclasses import dataclass

from ddnb._checks import Checks


class TaskTimeoutError(TimeoutError):
    """Raised inside a task that runs longer than its timeout."""


# ------------------------------------------------------------------ many tasks
@dataclass
class TaskResult:
    """What became of task `index`: status "ok" (value is fn's return), "error" (error is
    "Type: message") or "timeout"; engine it ran on; start/end seconds since submission."""

    index: int
    config: object
    status: str
    value: object = None
    error: str | None = None
    engine_id: int | None = None
    start: float | None = None
    end: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class _Progress:
    """A progress bar (ipywidgets) in a notebook, or a callback(done, total, result).
    The bar is displayed at 0 (the same text every run, which nbval compares) and then
    updated in place; its final state is what the saved notebook shows."""

    def __init__(self, progress, total: int):
        self.total, self.callback, self.widget = total, None, None
        if callable(progress):
            self.callback = progress
        elif progress and _in_notebook():
            import ipywidgets as w
            from IPython.display import display

            self.bar = w.IntProgress(value=0, min=0, max=total, description="tasks")
            self.label = w.Label(value=f"0 of {total} finished")
            self.widget = w.HBox([self.bar, self.label])
            display(self.widget)

    def update(self, results: list) -> None:
        done = [r for r in results if r is not None]
        if self.widget is not None:
            failed = sum(r.status == "error" for r in done)
            late = sum(r.status == "timeout" for r in done)
            self.bar.value = len(done)
            self.label.value = f"{len(done)} of {self.total} finished ({failed} failed, {late} timed out)"
            if len(done) == self.total:
                self.bar.bar_style = "success" if failed + late == 0 else "warning"
        if self.callback is not None and done:
            self.callback(len(done), self.total, done[-1])


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def run_tasks(view, fn, configs, timeout: float = 60.0, progress=True, deadline: float | None = None,
              poll: float = 0.05) -> list[TaskResult]:
    """Run fn(config) for every config on the engines of `view` (an ipyparallel
    LoadBalancedView); returns one TaskResult per config, in submission order, whatever
    happened to it. Never raises for a task: failures are in the results.

    timeout: seconds one task may run once an engine has started it; then it is stopped
        (TaskTimeoutError raised in it on the engine; a task that does not stop for that is
        interrupted with SIGINT from here after a grace of 5 s + 50%) and reported as "timeout".
        The clock starts when the task itself starts, after its function has been unpacked
        on the engine (which may import modules: not the task's fault).
    deadline: seconds for the whole call (default: enough for every task to use its
        timeout and grace, one wave of engines after another, plus one more); tasks that
        have not finished by then are aborted (or interrupted) and reported as "timeout".
    progress: True (a progress bar when in a notebook), False, or callback(done, total, result).
    """
    configs = list(configs) if isinstance(configs, (list, tuple)) else configs
    with Checks("run_tasks") as check:
        check.rule(isinstance(configs, list) and configs, f"configs={configs!r}: need a non-empty list of configs")
        check.rule(callable(fn), f"fn={fn!r}: need a callable")
        check.number("timeout", timeout, positive=True, why=" (seconds)")
        check.number("deadline", deadline, positive=True, none=True, why=" (seconds) or None")
        check.rule(hasattr(view, "apply_async") and getattr(view, "client", None) is not None,
                   f"view={view!r}: need an ipyparallel view (cluster.client.load_balanced_view())")
    client = view.client
    engines = _view_engines(view)
    if not engines:
        raise ValueError("the view has no engines to run tasks on")
    waves = math.ceil(len(configs) / len(engines))
    grace = 5.0 + 0.5 * timeout
    deadline = float(deadline) if deadline is not None else (timeout + grace) * (waves + 1)

    bar = _Progress(progress, len(configs))
    t0 = time.monotonic()
    ars = [view.apply_async(_call_with_timeout, fn, c, timeout) for c in configs]
    results: list[TaskResult | None] = [None] * len(ars)
    started: dict[int, tuple[float, int]] = {}   # task -> (seen running at, engine id)
    while any(r is None for r in results):
        now = time.monotonic()
        for k, ar in enumerate(ars):
            if results[k] is not None:
                continue
            if ar.ready():
                results[k] = _collect(k, configs[k], ar, t0, started.get(k))
            else:
                md = client.metadata[ar.msg_ids[0]]
                if k not in started and md.get("engine_id") is not None and (md.get("data") or {}).get(_STARTED):
                    started[k] = (now, md["engine_id"])
                if k in started and now - started[k][0] > timeout + grace:
                    _interrupt(client, started[k][1])
                    results[k] = TaskResult(k, configs[k], "timeout", engine_id=started[k][1],
                                            error=f"TimeoutError: still running after {timeout:g} s "
                                                  f"(and {grace:g} s of grace); engine {started[k][1]} interrupted",
                                            start=started[k][0] - t0, end=now - t0)
                elif now - t0 > deadline:
                    with contextlib.suppress(Exception):
                        client.abort(ar, block=False)
                    if k in started:
                        _interrupt(client, started[k][1])
                    results[k] = TaskResult(k, configs[k], "timeout", engine_id=started.get(k, (0, None))[1],
                                            error=f"TimeoutError: not finished within the deadline of {deadline:g} s",
                                            start=started[k][0] - t0 if k in started else None, end=now - t0)
            if results[k] is not None:
                bar.update(results)
        pending = [ar for ar, r in zip(ars, results) if r is None]
        if pending:
            pending[0].wait(poll)
    return results


_STARTED = "ddnb_task_started"


def _call_with_timeout(fn, config, timeout: float):
    """Runs on an engine: tells the client that the task starts (an ipyparallel data
    message), then fn(config), with TaskTimeoutError raised in it after `timeout` seconds
    (a SIGALRM timer; where there is none, e.g. off the main thread, no limit here and the
    caller's interrupt is the only one)."""
    import threading

    try:
        from ipyparallel.datapub import publish_data

        publish_data({_STARTED: True})
    except Exception:   # not on an engine: nobody to tell
        pass

    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        return fn(config)

    def on_alarm(signum, frame):
        raise TaskTimeoutError(f"still running after {timeout:g} s; stopped")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        return fn(config)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _view_engines(view) -> list[int]:
    targets = getattr(view, "targets", None)
    if targets is None or targets == "all":
        return sorted(view.client.ids)
    return [targets] if isinstance(targets, int) else list(targets)


def _collect(k, config, ar, t0, seen) -> TaskResult:
    """The TaskResult of a finished AsyncResult: value or error, engine, engine-side times."""
    md = ar.metadata
    eid = md.get("engine_id", seen[1] if seen else None)
    start = end = None
    if md.get("started") is not None and md.get("completed") is not None:
        now_wall, now_mono = time.time(), time.monotonic()
        to_rel = lambda d: d.timestamp() - now_wall + now_mono - t0    # engine clock -> seconds since t0
        start, end = to_rel(md["started"]), to_rel(md["completed"])
    try:
        return TaskResult(k, config, "ok", value=ar.get(0), engine_id=eid, start=start, end=end)
    except Exception as e:
        name, msg = getattr(e, "ename", type(e).__name__), getattr(e, "evalue", str(e))
        if name in ("TaskTimeoutError", "KeyboardInterrupt"):
            return TaskResult(k, config, "timeout", error=f"{name}: {msg}", engine_id=eid, start=start, end=end)
        return TaskResult(k, config, "error", error=f"{name}: {msg}", engine_id=eid, start=start, end=end)


def _interrupt(client, engine_id) -> None:
    """SIGINT to an engine (through its nanny): the running task gets KeyboardInterrupt."""
    with contextlib.suppress(Exception):
        client.send_signal(signal.SIGINT, targets=[engine_id], block=False)


def results_table(results: list[TaskResult]):
    """One row per task (a pandas DataFrame indexed by task): the config's keys when it is a
    dict, status, engine, the scalar entries of a dict value, and the error."""
    import pandas as pd

    rows = []
    for r in results:
        row = dict(r.config) if isinstance(r.config, dict) else {"config": repr(r.config)}
        row.update(status=r.status, engine=r.engine_id)
        if isinstance(r.value, dict):
            row.update({k: v for k, v in r.value.items() if isinstance(v, (int, float, str, bool)) or v is None})
        elif r.value is not None and isinstance(r.value, (int, float, str, bool)):
            row["value"] = r.value
        row["error"] = r.error
        rows.append(row)
    return pd.DataFrame(rows, index=pd.Index([r.index for r in results], name="task"))


def task_events(results: list[TaskResult]) -> list[dict]:
    """Plain dicts {index, engine, start, end, status} for `ddnb.viz.plot_task_timeline`."""
    return [{"index": r.index, "engine": r.engine_id, "start": r.start, "end": r.end, "status": r.status}
            for r in results]


# ------------------------------------------------------------------ speedup
def time_task_set(client, engine_ids, fn, configs, counts=(1, 2, 4), timeout: float = 60.0,
                  repeats: int = 1) -> dict[int, float]:
    """{engines: wall seconds} to run the same `configs` on a load-balanced view over the
    first `engines` of `engine_ids`, for each count (the best of `repeats` runs). Raises if
    a task fails: a speedup of failed work means nothing."""
    engine_ids, counts = list(engine_ids), tuple(counts)
    with Checks("time_task_set") as check:
        check.integers("counts", counts, min=1, max=len(engine_ids), why=f" (1..{len(engine_ids)}: the engines given)")
        check.integer("repeats", repeats, min=1)
    times = {}
    for k in counts:
        view = client.load_balanced_view(targets=engine_ids[:k])
        best = math.inf
        for _ in range(repeats):
            t = time.perf_counter()
            results = run_tasks(view, fn, configs, timeout=timeout, progress=False)
            best = min(best, time.perf_counter() - t)
            failed = [r for r in results if not r.ok]
            if failed:
                raise RuntimeError(f"{len(failed)} tasks did not finish on {k} engines: "
                                   + "; ".join(f"task {r.index}: {r.error}" for r in failed))
        times[k] = best
    return times
