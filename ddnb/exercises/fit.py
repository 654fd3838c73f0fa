"""Checker for fitting the alpha-beta model t = alpha + n beta to measured (size, time) pairs
(12): ordinary least squares in closed form (the 2x2 normal equations; Hockney 1994 for the
model). Compared with a least-squares solve on exact and on noisy data.
Taught in `notebooks/12_scalability.ipynb`.

    check_fit(my_fit)          # my_fit(sizes_bytes, times_s) -> (alpha, beta)
"""
from __future__ import annotations

import random

import torch

from ddnb._checks import Checks
from ddnb.exercises.core import passed

SHORTCUTS = ("fit_alpha_beta", "polyfit", "lstsq", "LinearRegression")


def least_squares(sizes, times) -> tuple[float, float]:
    """(alpha, beta) minimizing sum (alpha + n beta - t)^2, by torch.linalg.lstsq (float64)."""
    A = torch.tensor([[1.0, float(n)] for n in sizes], dtype=torch.float64)       # (k, 2)
    t = torch.tensor([[float(x)] for x in times], dtype=torch.float64)            # (k, 1)
    a, b = torch.linalg.lstsq(A, t).solution.flatten().tolist()
    return a, b


def _cases():
    rng = random.Random(0)
    sizes = [4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20]
    exact = [(sizes, [50e-6 + n / 1.25e9 for n in sizes])]
    noisy = [(sizes, [a + n * b * rng.uniform(0.9, 1.1) + rng.uniform(0, 5e-6) for n in sizes])
             for a, b in ((20e-6, 1 / 10e9), (3e-6, 1 / 300e9), (1e-3, 1 / 1e8))]
    return exact + noisy + [([0, 1000, 2000], [1.0, 2.0, 4.0])]


def check_fit(fn) -> str:
    """Call `fn(sizes_bytes, times_s)` on exact and noisy alpha-beta data: it must return
    (alpha, beta) of the ordinary least-squares line (relative 1e-6)."""
    with Checks("check_fit") as check:
        check.rule(callable(fn), f"fn={fn!r}: need a function fn(sizes_bytes, times_s) returning (alpha, beta)")
    used = [n for n in SHORTCUTS if n in getattr(getattr(fn, "__code__", None), "co_names", ())]
    if used:
        raise AssertionError(f"{fn.__name__} calls {used[0]}: write the two normal equations yourself, that is the "
                             f"exercise")
    for sizes, times in _cases():
        got = fn(list(sizes), list(times))
        want = least_squares(sizes, times)
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            raise AssertionError(f"got {got!r}: return the pair (alpha, beta)")
        for name, g, w in zip(("alpha", "beta"), got, want):
            if abs(float(g) - w) > 1e-6 * abs(w) + 1e-15:
                raise AssertionError(
                    f"sizes {sizes}, times {[f'{t:.3g}' for t in times]}: {name} = {float(g):.6g}, least squares gives "
                    f"{w:.6g}. With k points: beta = (k sum(n t) - sum(n) sum(t)) / (k sum(n^2) - sum(n)^2), "
                    f"alpha = (sum(t) - beta sum(n)) / k")
    return passed("check_fit", f"alpha and beta of the least-squares line on {len(_cases())} data sets")
