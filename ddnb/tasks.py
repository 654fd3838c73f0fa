"""Task parallelism: many independent jobs (a hyperparameter search, an ensemble) spread over
the engines by ipyparallel's load-balanced view. No worker talks to another; each task is
one ordinary single-process training, so this needs no torch.distributed at all.

    configs = grid(lr=[0.01, 0.1, 0.5], hidden=[16, 64])           # 6 configurations, in order
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
interrupted from here (SIGINT to its engine) a little later.

Random search: Bergstra & Bengio, "Random Search for Hyper-Parameter Optimization", JMLR
2012 (Sec. 2: with few parameters that matter, random trials cover each of them with more
distinct values than a grid of the same size). Ensembles: Dietterich, "Ensemble Methods in
Machine Learning", MCS 2000 (Sec. 2, majority vote); Lakshminarayanan et al., "Simple and
Scalable Predictive Uncertainty Estimation using Deep Ensembles", NeurIPS 2017 (Sec. 2.4,
the mean of the members' softmax). Taught in `notebooks/02_task_parallelism.ipynb`.
"""
from __future__ import annotations

import contextlib
import itertools
import math
import random
import signal
import time
from dataclasses import dataclass

DEFAULTS = {"lr": 0.1, "hidden": 64, "steps": 200, "batch_size": 64, "momentum": 0.9, "seed": 0,
            "return_probs": False}

class TaskTimeoutError(TimeoutError):
    """Raised inside a task that runs longer than its timeout."""


# ------------------------------------------------------------------ the search space
@dataclass(frozen=True)
class LogUniform:
    """A value drawn uniformly in log space between low and high (both > 0): learning
    rates 1e-3..1 get as many draws per decade (Bergstra & Bengio 2012, Sec. 2)."""

    low: float
    high: float

    def __post_init__(self):
        if not (self.low > 0 and self.high > self.low):
            raise ValueError(f"LogUniform needs 0 < low < high, got low={self.low!r}, high={self.high!r}")

    def sample(self, rng: random.Random) -> float:
        return float(f"{math.exp(rng.uniform(math.log(self.low), math.log(self.high))):.3g}")


def grid(base: dict | None = None, **axes) -> list[dict]:
    """Every combination of the values of `axes` (itertools.product order: the last axis
    varies fastest), each merged over `base`. grid(lr=[0.1, 1], hidden=[8, 16]) ->
    [{lr: 0.1, hidden: 8}, {lr: 0.1, hidden: 16}, {lr: 1, hidden: 8}, {lr: 1, hidden: 16}]."""
    if not axes:
        raise ValueError("grid needs at least one axis, e.g. grid(lr=[0.01, 0.1])")
    empty = [k for k, v in axes.items() if not isinstance(v, (list, tuple)) or len(v) == 0]
    if empty:
        raise ValueError(f"grid axes must be non-empty lists of values; not so: "
                         + ", ".join(f"{k}={axes[k]!r}" for k in empty))
    names = list(axes)
    return [{**(base or {}), **dict(zip(names, values))} for values in itertools.product(*axes.values())]


def random_search(n: int, seed: int = 0, base: dict | None = None, **space) -> list[dict]:
    """n configurations drawn from `space`: a LogUniform is sampled, a list or tuple is
    chosen from uniformly, anything else is a fixed value. The same (n, seed, space) gives
    the same configurations, in the same order, on every machine."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"random_search needs n >= 1 configurations, got n={n!r}")
    if not space:
        raise ValueError("random_search needs a search space, e.g. lr=LogUniform(1e-3, 1), hidden=[16, 64]")
    empty = [k for k, v in space.items() if isinstance(v, (list, tuple)) and len(v) == 0]
    if empty:
        raise ValueError(f"random_search: empty choices for {empty}")
    rng = random.Random(seed)
    draw = lambda v: v.sample(rng) if isinstance(v, LogUniform) else (
        rng.choice(list(v)) if isinstance(v, (list, tuple)) else v)
    return [{**(base or {}), **{k: draw(v) for k, v in space.items()}} for _ in range(n)]


# ------------------------------------------------------------------ one task
def check_config(config: dict) -> dict:
    """The config over DEFAULTS; raises ValueError naming every unknown key and bad value."""
    if not isinstance(config, dict):
        raise ValueError(f"a task config is a dict, got {type(config).__name__}: {config!r}")
    unknown = sorted(set(config) - set(DEFAULTS))
    c = {**DEFAULTS, **config}
    bad = [f"unknown keys {unknown} (known: {sorted(DEFAULTS)})"] if unknown else []
    for name in ("hidden", "steps", "batch_size"):
        v = c[name]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            bad.append(f"{name} must be an integer >= 1, got {v!r}")
    if not (isinstance(c["lr"], (int, float)) and c["lr"] > 0):
        bad.append(f"lr must be > 0, got {c['lr']!r}")
    if not (isinstance(c["momentum"], (int, float)) and 0 <= c["momentum"] < 1):
        bad.append(f"momentum must be in [0, 1), got {c['momentum']!r}")
    if bad:
        raise ValueError("bad task config: " + "; ".join(bad))
    return c


def train_digits_task(config: dict) -> dict:
    """One independent training, in the calling process: an MLP 64 -> hidden -> 10 on
    scikit-learn's digits, `steps` of SGD with momentum on seeded batches. Returns
    {test_accuracy, train_loss (mean of the last 10 steps), test_loss, seconds, pid}, and
    "probs" (test examples, 10) softmax outputs when config["return_probs"]."""
    import os

    import torch
    import torch.nn.functional as F

    from ddnb.data import batch, digits
    from ddnb.models import mlp

    c = check_config(config)
    t0 = time.perf_counter()
    train, test = digits(seed=0)
    model = mlp((64, c["hidden"], 10), seed=c["seed"])
    opt = torch.optim.SGD(model.parameters(), lr=c["lr"], momentum=c["momentum"])
    losses = []
    for step in range(c["steps"]):
        x, y = batch(train, c["batch_size"], step, seed=c["seed"])     # (B, 64), (B,)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    with torch.no_grad():
        logits = model(test.x)                                        # (n_test, 10)
    out = {"test_accuracy": (logits.argmax(-1) == test.y).float().mean().item(),
           "train_loss": sum(losses[-10:]) / len(losses[-10:]),
           "test_loss": F.cross_entropy(logits, test.y).item(),
           "seconds": time.perf_counter() - t0, "pid": os.getpid()}
    if c["return_probs"]:
        out["probs"] = torch.softmax(logits, -1)
    return out


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
    if not isinstance(configs, list) or not configs:
        raise ValueError(f"run_tasks needs a non-empty list of configs, got {configs!r}")
    if not callable(fn):
        raise ValueError(f"fn must be callable, got {fn!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if deadline is not None and (isinstance(deadline, bool) or not isinstance(deadline, (int, float))
                                 or not deadline > 0):
        raise ValueError(f"deadline must be a positive number of seconds or None, got {deadline!r}")
    if not hasattr(view, "apply_async") or getattr(view, "client", None) is None:
        raise ValueError(f"view must be an ipyparallel view (cluster.client.load_balanced_view()), got {view!r}")
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


# ------------------------------------------------------------------ ensembles
def ensemble_accuracy(probs, labels, method: str = "mean") -> float:
    """Accuracy of the ensemble of K models given their softmax outputs `probs` (K, n,
    classes) (a list of (n, classes) tensors is fine) on `labels` (n,): "mean" averages the
    probabilities, then takes the arg-max (Lakshminarayanan et al. 2017, Sec. 2.4); "vote"
    takes each model's arg-max and the most frequent class, ties to the lower class
    (Dietterich 2000, Sec. 2)."""
    import torch

    if method not in ("mean", "vote"):
        raise ValueError(f"method={method!r} is not one of ('mean', 'vote')")
    p = torch.stack(list(probs)) if not isinstance(probs, torch.Tensor) else probs    # (K, n, C)
    labels = torch.as_tensor(labels)
    if p.dim() != 3 or p.shape[0] < 1 or p.shape[1] != labels.shape[0]:
        raise ValueError(f"probs must be (K >= 1, n, classes) with n = len(labels) = {labels.shape[0]}, "
                         f"got {tuple(p.shape)}")
    if method == "mean":
        pred = p.mean(0).argmax(-1)                                                   # (n,)
    else:
        votes = torch.nn.functional.one_hot(p.argmax(-1), p.shape[-1]).sum(0)         # (n, C)
        pred = votes.argmax(-1)                # first maximum: ties go to the lower class
    return (pred == labels).float().mean().item()


# ------------------------------------------------------------------ speedup
def time_task_set(client, engine_ids, fn, configs, counts=(1, 2, 4), timeout: float = 60.0,
                  repeats: int = 1) -> dict[int, float]:
    """{engines: wall seconds} to run the same `configs` on a load-balanced view over the
    first `engines` of `engine_ids`, for each count (the best of `repeats` runs). Raises if
    a task fails: a speedup of failed work means nothing."""
    engine_ids = list(engine_ids)
    bad = [k for k in counts if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= len(engine_ids)]
    if bad or not counts:
        raise ValueError(f"counts must be integers in 1..{len(engine_ids)} (the engines given), got {list(counts)}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an integer >= 1, got {repeats!r}")
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
