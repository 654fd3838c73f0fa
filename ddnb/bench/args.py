"""The argument types of `python -m ddnb.bench` (`ddnb/bench/__main__.py`): each parses one
command-line value or raises argparse.ArgumentTypeError naming the rule, so that a bad
flag is refused before any process starts; and the --emulate/--slowdown pair every
emulated benchmark shares (`add_emulate_arguments`, `emulated`). Taught with the benchmarks in
`notebooks/05_allreduce.ipynb`.
"""
from __future__ import annotations

import argparse
import os
import sys

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
    slowdown is the default for `ranks` processes on this machine
    (`placement.default_slowdown`: the profile's scaled by workers per core, or more where
    this machine's measured costs need more; `ranks` defaults to the largest --workers or
    --stages), unless --slowdown gives it. The largest default used is kept in
    args.default_slowdown, for the repeat of a run that overran (`ddnb.bench.__main__`)."""
    if args.emulate is None:
        if args.slowdown is not None:
            parser.error("--slowdown needs --emulate")
        return None
    from ddnb.emulate import get_profile
    from ddnb.runtime.placement import default_slowdown

    profile = get_profile(args.emulate)
    if args.slowdown:
        return profile.with_(slowdown=args.slowdown)
    if ranks is None:
        ranks = getattr(args, "workers", None) or getattr(args, "stages", 1)   # the largest world of the run
        ranks = max(ranks) if isinstance(ranks, list) else ranks
    profile = profile.with_(slowdown=default_slowdown(profile, ranks))
    args.default_slowdown = max(getattr(args, "default_slowdown", 0.0), profile.slowdown)
    return profile


def run_without_overruns(args, run, factor: float = 2.0):
    """run() -> exit status, for a command line with --emulate and no --slowdown: its output
    is held back and, if it reports overruns (`ddnb.emulate.overruns`: real work outran its
    model, so its times are wrong), the run is repeated at `factor` times the default
    slowdown, saying so on stderr (`ddnb.emulate.without_overruns`), before the last run's
    output is printed. Real mode, or a --slowdown the user chose, runs once as it is."""
    if getattr(args, "emulate", None) is None or getattr(args, "slowdown", None) is not None:
        return run()
    import contextlib
    import io

    from ddnb.emulate import overruns, without_overruns

    def once(slowdown=None):
        args.slowdown = slowdown
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = run()
        return rc, buf.getvalue()

    def say(line):
        print(f"bench: {line}", file=sys.stderr, flush=True)

    rc, text = once()
    n = overruns(text)
    if n and getattr(args, "default_slowdown", None):
        slowdown = args.default_slowdown
        say(f"{n} overruns at the default slowdown {slowdown:g}x (real work outran its model): "
            f"running again at {slowdown * factor:g}x")
        rc, text = without_overruns(once, slowdown * factor, emulation=lambda out: out[1], factor=factor,
                                    tries=2, say=say)
    sys.stdout.write(text)
    sys.stdout.flush()
    return rc
