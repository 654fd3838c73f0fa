"""One validation helper for the whole package: every problem in a call's arguments is
collected, then one ValueError lists them all, before any process starts or blocks.

    with Checks("Cluster") as check:
        check.integer("n", n, min=1, max=64)
        check.number("timeout", timeout, positive=True)
        check.choice("backend", backend, ("auto", "gloo", "nccl"))
        check.rule(not (horovod and not installed), "horovod=True but Horovod is not installed")
    # -> ValueError: "Cluster: n=0: need an integer >= 1 and <= 64; timeout=-1: need a number > 0"

A check returns whether its value passed, so later rules can depend on earlier ones
(`if check.integer("k", k, min=1): check.rule(k <= n, ...)`). Also: `integers` (a list of
them), `positive_ints` / `positive_numbers` (several sizes at once), `check_positive_ints`
(a whole check in one call). A module's own helper that adds its rules to a `Checks`
(`_link(check, "net", net)`) keeps one error per call. `is_int` and `is_number`
are the predicates alone (bool is neither: True is not a worker count). The helper
behind every error message on bad input (`tests/test_bad_input.py`); taught nowhere, used
by every notebook's code (`notebooks/00_getting_started.ipynb` on).
"""
from __future__ import annotations

import math
from numbers import Real


def is_int(value) -> bool:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    """A finite real number (int or float, not bool, not nan or inf)."""
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)


def _bounds(min=None, max=None, strict: bool = False, below=None) -> str:
    """The bounds in words, e.g. " >= 1 and <= 64", " > 0", " >= 0 and < 1"; "" without any."""
    parts = [f"{'>' if strict else '>='} {min}"] if min is not None else []
    parts += [f"<= {max}"] if max is not None else []
    parts += [f"< {below}"] if below is not None else []
    return " " + " and ".join(parts) if parts else ""


class Checks:
    """Collects problems; `done()` (or leaving the `with` block) raises one ValueError
    listing all of them, prefixed with `where` (the function or class checked). `error`:
    another exception class, e.g. TypeError for a block that checks only types."""

    def __init__(self, where: str = "", error: type[Exception] = ValueError):
        self.where, self.error, self.problems = where, error, []

    def __enter__(self) -> "Checks":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.done()

    def done(self) -> None:
        if self.problems:
            prefix = f"{self.where}: " if self.where else ""
            raise self.error(prefix + "; ".join(self.problems))

    def rule(self, ok: bool, message: str) -> bool:
        """Record `message` unless ok."""
        if not ok:
            self.problems.append(message)
        return bool(ok)

    def integer(self, name: str, value, min: int | None = None, max: int | None = None,
                none: bool = False, why: str = "") -> bool:
        """An int (not bool) within [min, max]; None passes with none=True."""
        if value is None and none:
            return True
        ok = is_int(value) and (min is None or value >= min) and (max is None or value <= max)
        return self.rule(ok, f"{name}={value!r}: need an integer{_bounds(min, max)}{why}")

    def number(self, name: str, value, min: float | None = None, max: float | None = None,
               positive: bool = False, below: float | None = None, none: bool = False, why: str = "") -> bool:
        """A finite real number within [min, max] (> 0 with positive=True, < below with below)."""
        if value is None and none:
            return True
        lo = 0 if positive else min
        ok = is_number(value) and (lo is None or (value > lo if positive else value >= lo)) and (
            max is None or value <= max) and (below is None or value < below)
        nonfinite = isinstance(value, Real) and not isinstance(value, bool) and not math.isfinite(value)
        finite = "a finite" if nonfinite else "a"
        return self.rule(ok, f"{name}={value!r}: need {finite} number{_bounds(lo, max, positive, below)}{why}")

    def choice(self, name: str, value, choices) -> bool:
        """One of `choices`."""
        return self.rule(value in tuple(choices), f"{name}={value!r} is not one of {tuple(choices)}")

    def integers(self, name: str, values, min: int | None = None, max: int | None = None,
                 count: int = 1, why: str = "") -> bool:
        """A list or tuple of at least `count` ints (not bools), each within [min, max]."""
        ok = isinstance(values, (list, tuple)) and len(values) >= count and all(
            is_int(v) and (min is None or v >= min) and (max is None or v <= max) for v in values)
        how_many = f"at least {count}" if count > 1 else "a non-empty list of"
        return self.rule(ok, f"{name}={values!r}: need {how_many} integers{_bounds(min, max)}{why}")

    def positive_ints(self, **values) -> bool:
        """Each keyword an integer >= 1 (sizes, counts, dimensions)."""
        return all([self.integer(name, v, min=1) for name, v in values.items()])

    def positive_numbers(self, **values) -> bool:
        """Each keyword a finite number > 0 (FLOPs, bytes, rates)."""
        return all([self.number(name, v, positive=True) for name, v in values.items()])


def check_positive_ints(where: str = "", **values) -> None:
    """ValueError listing every keyword that is not an integer >= 1."""
    with Checks(where) as check:
        check.positive_ints(**values)
