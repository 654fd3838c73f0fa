"""Checker for the zero-bubble chapter (09b): the learner's ZB-H1, written as action lists
("F3", "B3", "W3"), is proven and priced by the static checker and then run on real
processes (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", ICLR 2024, Sec. 2.1,
Fig. 3 top). Taught in `notebooks/09b_zero_bubble.ipynb`.

    check_zbh1(my_zbh1)      # my_zbh1(stages, microbatches) -> one action list per rank

ddnb's own generators are the answer to this exercise, so they are refused: by name in
the learner's code, and switched off while the learner's function runs.
"""
from __future__ import annotations

import contextlib

from ddnb._checks import Checks
from ddnb.exercises.core import passed, run_on_ranks, used_name
from ddnb.exercises.pipeline import _as_actions, _run_pipeline
from ddnb.pipeline_parallel.schedules import FORWARD, simulate, validate_schedule, zbh1_schedule

SHORTCUTS = ("zbh1_schedule", "get_schedule", "SCHEDULES", "zbv_schedule", "dualpipev_schedule")
_HOLDERS = ("ddnb.pipeline_parallel", "ddnb.pipeline_parallel.schedules", "ddnb.pipeline_parallel.zero_bubble")


def _refused(*args, **kwargs):
    raise AssertionError("ddnb's zbh1_schedule is off in this exercise: write the action lists yourself")


@contextlib.contextmanager
def _library_off():
    """ddnb's ZB-H1 generator refuses while the learner's function runs (by every name a
    notebook reaches it through, and in the table get_schedule reads); put back after."""
    import importlib

    mods = [importlib.import_module(m) for m in _HOLDERS]
    table = mods[1].SCHEDULES
    saved = [(m, m.zbh1_schedule) for m in mods], table["zbh1"]
    try:
        for m in mods:
            m.zbh1_schedule = _refused
        table["zbh1"] = _refused
        yield
    finally:
        for m, fn in saved[0]:
            m.zbh1_schedule = fn
        table["zbh1"] = saved[1]


def _idle(schedule) -> list[float]:
    """Each rank's idle time in the step on the unit-cost model (F = B = W = 1)."""
    events = simulate(schedule)
    t0, t1 = min(e["start"] for e in events), max(e["end"] for e in events)
    return [t1 - t0 - sum(e["end"] - e["start"] for e in events if e["rank"] == r) for r in range(len(schedule))]


def _priced(schedule, stages: int, m: int) -> None:
    """AssertionError unless `schedule` is a valid split schedule at 1F1B's memory with
    ZB-H1's unit-cost bubble, naming the rank and what to move."""
    try:
        report = validate_schedule(schedule, m)
    except ValueError as e:
        raise AssertionError(f"m = {m}: {e}. Hint: on every rank B(j) after F(j) and W(j) after B(j); B(j) "
                             f"waits for B(j) of the next rank, F(j) for F(j) of the previous one") from None
    if not report.split_backward:
        raise AssertionError(f"m = {m}: no W actions: split each backward into B(j) (input gradient) and W(j) "
                             f"(weight gradient), then move the W's")
    for r, held in enumerate(report.peak_until_b):
        bound = min(stages - r, m)
        if held > bound:
            first_b = next(i for i, a in enumerate(schedule[r]) if a.op != FORWARD)
            raise AssertionError(f"m = {m}: rank {r} holds {held} micro-batches' whole activations at once "
                                 f"(F until B), 1F1B and ZB-H1 at most {bound}: it runs {first_b} forwards before "
                                 f"its first B; keep 1F1B's F and B order and move only the W's")
    ref = validate_schedule(zbh1_schedule(stages, m), m)
    if report.bubble > ref.bubble + 1e-9:
        mine, best = _idle(schedule), _idle(zbh1_schedule(stages, m))
        r = next(r for r in range(stages) if mine[r] > best[r] + 1e-9)
        raise AssertionError(f"m = {m}: the bubble on paper (F = B = W = 1) is {report.bubble:.3f}, ZB-H1's "
                             f"{ref.bubble:.3f}: rank {r} idles {mine[r]:g} units, ZB-H1's rank {r} {best[r]:g}. "
                             f"Hint: a W waits for nothing across ranks; rank r can run each W(j) r micro-batches "
                             f"after its B(j), so that its B's go up without waiting and the W's fill the "
                             f"cool-down")


def check_zbh1(schedule_fn, stages: int = 4, microbatches=(4, 6, 8), run: bool = True, timeout: float = 60) -> str:
    """`schedule_fn(stages, microbatches)` returns one action list per rank ("F3", "B3",
    "W3" or Actions). Checked for each m of `microbatches`, in order: ddnb's own generators
    are not used (by name, and switched off while it runs); `validate_schedule` proves it
    (every F, B and W once, B after F, W after B, no deadlock); it splits the backward;
    no rank holds more micro-batches F until B than 1F1B's p - r; its unit-cost bubble is
    ZB-H1's (F = B = W = 1, `simulate`). With `run`, the last m's schedule then runs on
    `stages` real processes through ddnb's executor, B and W split as torch does, and
    gives one process's gradients (1e-5)."""
    with Checks("check_zbh1") as check:
        check.rule(callable(schedule_fn), f"schedule_fn={schedule_fn!r}: need a function (stages, microbatches)")
        check.integer("stages", stages, min=2, max=8)
        ms = list(microbatches) if isinstance(microbatches, (list, tuple)) else [microbatches]
        check.positive_ints(**{f"microbatches[{i}]": m for i, m in enumerate(ms)})
    used = used_name(schedule_fn, SHORTCUTS)
    if used:
        raise AssertionError(f"{getattr(schedule_fn, '__name__', 'schedule_fn')} uses {used}, ddnb's own "
                             f"schedules: write ZB-H1's action lists yourself, that is the exercise")
    schedules = []
    for m in ms:
        with _library_off():
            got = schedule_fn(stages, m)
        schedule = _as_actions(got)
        if len(schedule) != stages:
            raise AssertionError(f"m = {m}: expected one action list per rank ({stages}), got {len(schedule)}")
        _priced(schedule, stages, m)
        schedules.append(schedule)
    ran = ""
    if run:
        errors = run_on_ranks(_run_pipeline, stages, schedules[-1], ms[-1], what="your schedule", timeout=timeout)
        worst = max(e for _, e in errors)
        if worst > 1e-5:
            raise AssertionError(f"gradients differ from one process by {worst:.2e} on rank "
                                 f"{max(errors, key=lambda x: x[1])[0]}")
        ran = f"; run on {stages} processes (m = {ms[-1]}): gradients equal to one process's"
    bubbles = ", ".join(f"{validate_schedule(s, m).bubble:.3f} (m = {m})" for s, m in zip(schedules, ms))
    return passed("check_zbh1", f"valid, 1F1B's memory (F until B), ZB-H1's bubble on paper {bubbles}{ran}")
