""""Predict, then measure": the learner writes a number before the cell that measures or
computes it; `check_prediction` compares the two and explains the difference.

    my_bytes = 3 * 4 * 2**20           # bytes the root sends in a naive all-reduce of 4 MB on 4 ranks
    ...                                # the cell that measures it from the trace
    check_prediction(my_bytes, measured, what="bytes the root sends", rel_tol=0,
                     why="the root sends the full sum to each of the N - 1 others")

A prediction is a number the learner commits to, so a wrong one is a lesson, not an
error in the notebook: the checker raises AssertionError with the expected value, the
ratio, and the reasoning (`why`). Used by the "predict" exercises of every chapter, first in
`notebooks/05_allreduce.ipynb`.
"""
from __future__ import annotations

import math

from ddnb._checks import Checks
from ddnb.exercises.core import passed


def check_prediction(predicted, actual, *, what: str, rel_tol: float = 0.1, why: str = "",
                     unit: str = "") -> str:
    """Accept `predicted` when within rel_tol of `actual` (0: exactly; for counts and
    bytes); else AssertionError: 'you predicted X <unit>, the answer is Y (ratio r). why'."""
    with Checks("check_prediction") as check:
        check.rule(predicted is not None and not isinstance(predicted, bool),
                   f"predicted={predicted!r}: write your prediction as a number (replace the None)")
        check.number("actual", actual)
        check.number("rel_tol", rel_tol, min=0)
    with Checks("check_prediction") as check:
        check.number("predicted", predicted)
    ok = predicted == actual if rel_tol == 0 else math.isclose(predicted, actual, rel_tol=rel_tol)
    u = f" {unit}" if unit else ""
    if not ok:
        ratio = f" ({predicted / actual:.3g}x the answer)" if actual else ""
        raise AssertionError(f"{what}: you predicted {predicted:.6g}{u}, the answer is {actual:.6g}{u}{ratio}. {why}"
                             .rstrip())
    tol = "exactly" if rel_tol == 0 else f"within {rel_tol:.0%}"
    return passed("check_prediction", f"{what}: {predicted:.6g}{u} matches {actual:.6g}{u} {tol}")
