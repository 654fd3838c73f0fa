"""The argument types of `python -m ddnb.bench` (`ddnb/bench/__main__.py`): each parses one
command-line value or raises argparse.ArgumentTypeError naming the rule, so that a bad
flag is refused before any process starts. Taught with the benchmarks in
`notebooks/05_allreduce.ipynb`.
"""
from __future__ import annotations

import argparse
import os

from ddnb.bench.allreduce import parse_sizes


def _at_least(minimum, kind=int, why: str = ""):
    """An argparse type: a number of `kind` >= minimum (> 0 when minimum is 0.0)."""
    def parse(text: str):
        try:
            x = kind(text)
        except ValueError:
            x = None
        if x is None or x < minimum or (minimum == 0 and not x > 0):
            rule = f"an integer >= {minimum}" if kind is int else "a number > 0"
            raise argparse.ArgumentTypeError(f"need {rule}{why}, got {text!r}")
        return x
    return parse


def _sizes(text: str) -> list[int]:
    try:
        return parse_sizes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _names(known):
    """An argparse type: a comma list of names from `known` (repeats dropped, order kept)."""
    def parse(text):
        got = list(dict.fromkeys(a.strip() for a in text.split(",") if a.strip()))
        unknown = [a for a in got if a not in known]
        if unknown or not got:
            raise argparse.ArgumentTypeError(f"unknown {unknown or text!r}; known: {', '.join(known)}")
        return got
    return parse


def _load() -> str:
    return f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"


def _ints(text: str) -> list[int]:
    try:
        got = [int(a) for a in text.split(",") if a.strip()]
    except ValueError:
        got = []
    if not got or min(got) < 1:
        raise argparse.ArgumentTypeError(f"need a comma list of integers >= 1, got {text!r}")
    return got
