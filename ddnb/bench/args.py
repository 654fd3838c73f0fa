"""The argument types of `python -m ddnb.bench` (`ddnb/bench/__main__.py`): each parses one
command-line value or raises argparse.ArgumentTypeError naming the rule, so that a bad
flag is refused before any process starts; and the --emulate/--slowdown pair every
emulated benchmark shares (`add_emulate_arguments`, `emulated`). Taught with the benchmarks in
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


def add_emulate_arguments(p) -> None:
    from ddnb.emulate import PROFILES

    p.add_argument("--emulate", metavar="PROFILE", choices=sorted(PROFILES),
                   help=f"run in an emulated cluster ({', '.join(sorted(PROFILES))}; ddnb.emulate): every time "
                        "is then the profile's emulated seconds")
    p.add_argument("--slowdown", type=_at_least(0.0, float),
                   help="real seconds per emulated second (default: the profile's); raise it if the run "
                        "reports overruns")


def emulated(parser, args, ranks: int | None = None):
    """The emulated profile the command line asks for (None: real mode). A named profile's
    slowdown is scaled for `ranks` processes on this machine's cores
    (`placement.scaled_slowdown`; default the largest --workers or --stages), unless
    --slowdown gives it."""
    if args.emulate is None:
        if args.slowdown is not None:
            parser.error("--slowdown needs --emulate")
        return None
    from ddnb.emulate import get_profile
    from ddnb.runtime.placement import scaled_slowdown

    profile = get_profile(args.emulate)
    if args.slowdown:
        return profile.with_(slowdown=args.slowdown)
    if ranks is None:
        ranks = getattr(args, "workers", None) or getattr(args, "stages", 1)   # the largest world of the run
        ranks = max(ranks) if isinstance(ranks, list) else ranks
    return profile.with_(slowdown=scaled_slowdown(profile.slowdown, ranks))
