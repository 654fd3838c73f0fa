"""What every exercise checker shares: run the learner's function on real processes with a
deadline, compare what each rank ends with against the reference, and answer with one
line of success or an AssertionError that names the rank, the element, expected vs got,
and what that pattern usually means.

    from ddnb.exercises.core import run_on_ranks, compare, passed

    def check_something(fn, world_size=3):
        got = run_on_ranks(fn_wrapper, world_size, fn, what="your_function")  # per rank
        for rank, g in enumerate(got):
            compare(g, expected[rank], rank=rank, hint=diagnose(...))
        return passed("check_something", "3 ranks, 4 sizes")

The processes are a `ddnb.testing.World` per world size, kept between checks (a check
costs a few ms after the first) and replaced when a learner's code broke it (a hang is
killed at the deadline: the next check starts a fresh world). Functions defined in a
notebook travel by value (cloudpickle), so a learner's cell is what runs.
Used by every `check_*` in `ddnb.exercises`; taught from `notebooks/05_allreduce.ipynb` on.
"""
from __future__ import annotations

import atexit
import functools
import re

import torch

from ddnb._checks import Checks
from ddnb.runtime.errors import WorkerError, WorkerLostError, WorkerTimeoutError

DEFAULT_TIMEOUT = 30.0
_worlds: dict = {}


def _world(n: int):
    from ddnb.testing import World

    w = _worlds.get(n)
    if w is None or w.broken:
        w = _worlds[n] = World(n, timeout=60)
    return w


@atexit.register
def close_worlds() -> None:
    """Stop the checkers' processes (also at interpreter exit)."""
    for w in _worlds.values():
        if not w.broken:
            w.close()
    _worlds.clear()


def check_sized_call(where: str, fn, world_size, sizes, min_world: int = 1) -> None:
    """One ValueError naming every bad argument of a checker that runs fn(tensor) on
    `world_size` ranks for each numel in `sizes`."""
    with Checks(where) as check:
        check.rule(callable(fn), f"fn={fn!r}: need a function fn(tensor)")
        check.integer("world_size", world_size, min=min_world, max=8)
        check.rule(isinstance(sizes, (list, tuple)) and len(sizes) > 0, f"sizes={sizes!r}: need a non-empty list")
        check.positive_ints(**{f"sizes[{i}]": v for i, v in enumerate(sizes or ())})


def run_on_ranks(fn, world_size: int, *args, what: str = "your function",
                 timeout: float = DEFAULT_TIMEOUT, per_rank_args: list | None = None) -> list:
    """fn(*args) (or fn(*per_rank_args[rank])) on `world_size` real processes of one gloo
    process group; the results in rank order. A hang, a raise or a death of the learner's
    code becomes an AssertionError naming the ranks, never a blocked notebook."""
    world = _world(world_size)
    try:
        if per_rank_args is None:
            return world.run(fn, *args, timeout=timeout)
        return world.run_ranks(fn, per_rank_args, timeout=timeout)
    except WorkerTimeoutError as e:
        raise AssertionError(
            f"{what} did not finish within {timeout:.0f} s on rank(s) {e.ranks}: a deadlock? Every send needs "
            f"the matching receive on the other rank, in an order that cannot wait in a circle (post both "
            f"with isend/irecv, or let even ranks send first)") from None
    except WorkerError as e:
        last = [ln for ln in str(e).strip().splitlines() if ln.strip()][-1]
        if last.startswith("NotImplementedError"):       # the learner's stub, run on a rank
            raise NotImplementedError(last.split(":", 1)[-1].strip()) from None
        raise AssertionError(f"{what} raised on rank {e.rank}: {last}") from None
    except WorkerLostError as e:
        raise AssertionError(f"{what}: rank(s) {e.ranks} died (the process exited): {e}") from None


def used_name(fn, names) -> str | None:
    """The first of `names` that fn's code, or a function defined inside it, uses (a global,
    an attribute or an imported name): how a checker refuses the library's shortcut."""
    codes = [getattr(fn, "__code__", None)]
    while codes:
        code = codes.pop()
        if code is None:
            continue
        hit = next((n for n in names if n in code.co_names), None)
        if hit:
            return hit
        codes += [c for c in code.co_consts if hasattr(c, "co_names")]
    return None


def first_mismatch(got: torch.Tensor, expected: torch.Tensor, atol: float = 1e-5):
    """(flat index, got value, expected value) of the first element that differs, else None.
    Shapes must be equal (a shape difference is reported by `compare`)."""
    g, e = got.detach().reshape(-1).double(), expected.detach().reshape(-1).double()
    bad = ~torch.isclose(g, e, rtol=1e-5, atol=atol)
    if not bool(bad.any()):
        return None
    i = int(bad.nonzero()[0])
    return i, g[i].item(), e[i].item()


def compare(got, expected: torch.Tensor, *, rank: int, name: str = "result", hint: str = "",
            atol: float = 1e-5) -> None:
    """AssertionError at the first difference between got and expected on `rank`:
    '<name> on rank 2, element 5: expected 6.0, got 2.0. <hint>'."""
    if not isinstance(got, torch.Tensor):
        raise AssertionError(f"{name} on rank {rank}: expected a tensor, got {type(got).__name__}")
    if tuple(got.shape) != tuple(expected.shape):
        raise AssertionError(f"{name} on rank {rank}: expected shape {tuple(expected.shape)}, got "
                             f"{tuple(got.shape)}. {hint}".rstrip())
    bad = first_mismatch(got, expected, atol)
    if bad is not None:
        i, g, e = bad
        raise AssertionError(f"{name} on rank {rank}, element {i}: expected {e:g}, got {g:g}. {hint}".rstrip())


class Passed(str):
    """A checker's success line: a str (tests read it), printed once by `passed`; a notebook
    does not echo it a second time as the cell's value."""

    def _ipython_display_(self) -> None:
        pass


def passed(name: str, detail: str) -> Passed:
    """Print and return the one-line success message of a checker."""
    msg = Passed(f"✓ {name}: {detail}")
    print(msg)
    return msg


class NotAttempted(Passed):
    """What a checker answers when given the learner's stub: one printed line, and the
    notebook runs on (a learner's copy runs top to bottom before any answer is written)."""


_ID = re.compile(r"Exercise\s+(\d+[a-z]?\.\d+)")


def attempted(answer) -> bool:
    """False for a stub of the learner's edition (`...`, or a function whose body raises
    NotImplementedError("Exercise 05.1: ...") or a class with such a method), True for
    anything else. For cells after an exercise that use the learner's answer:
    `if attempted(my_ring_allreduce): ...`."""
    if answer is Ellipsis:
        return False
    if isinstance(answer, type):            # a class: a stub while any of its own methods is one
        return all(attempted(f) for f in vars(answer).values() if callable(f))
    code = getattr(answer, "__code__", None)
    if code is None:
        return True
    stub_text = any(isinstance(c, str) and _ID.search(c) for c in code.co_consts)
    return not ("NotImplementedError" in code.co_names and stub_text)


def checker(check):
    """Decorate a `check_*`: an extra keyword `exercise="05.1"` names the exercise; given a
    stub (a `...` answer, or a function that raises NotImplementedError) it prints
    'Exercise 05.1 not attempted yet: ...' and returns instead of failing."""

    @functools.wraps(check)
    def wrapper(*args, exercise: str | None = None, **kwargs):
        values = list(args) + list(kwargs.values())
        if any(v is Ellipsis for v in values):
            return not_attempted(exercise, "your answer cell still holds `...`: write your answer there, run "
                                           "that cell, then this one")
        stub = next((v for v in values if callable(v) and not attempted(v)), None)
        if stub is not None:
            return not_attempted(exercise or _id_in(stub), f"{getattr(stub, '__name__', 'your function')} is "
                                 f"still the stub: write its body in the cell above, run it, then this cell")
        try:
            return check(*args, **kwargs)
        except NotImplementedError as e:
            if not _id_in(str(e)):          # not the stub's: a real error of the learner's code
                raise AssertionError(f"your code raised NotImplementedError: {e}") from None
            return not_attempted(exercise or _id_in(str(e)), str(e))

    return wrapper


def _id_in(obj) -> str | None:
    texts = [obj] if isinstance(obj, str) else [c for c in getattr(getattr(obj, "__code__", None), "co_consts", ())
                                                if isinstance(c, str)]
    return next((m.group(1) for t in texts for m in [_ID.search(t)] if m), None)


def not_attempted(exercise: str | None, why: str) -> NotAttempted:
    """Print and return the one line of a checker given a stub."""
    msg = NotAttempted(f"Exercise {exercise + ' ' if exercise else ''}not attempted yet: {why}")
    print(msg)
    return msg
