"""An emulated run that overran is a wrong time, not noise: in a rank whose clock a second
thread also moves (a communication thread), real work took longer than its model allows,
so the order of the two threads, and the clock, followed real time (`ddnb.emulate.clock`;
a single-threaded rank only lags, which changes no emulated time). `without_overruns`
runs again at a higher slowdown until no rank overran, saying so. A run that still overran
after its tries is refused (`refuse=True`, a RuntimeError) or returned under a warning line
that says its times are wrong (the default: a learner's notebook on a busy laptop goes on,
and the checks printed below it say what held). The stored notebooks hold only runs without
overruns (`make notebooks` and the before-stop hook check their outputs).

    sat = without_overruns(lambda p: server_vs_ring(p, model, data), picker.profile)
    rows = without_overruns(lambda s: link_sweep(slowdown=s), 100.0, emulation=lambda rows: rows)

Used by the emulated cells of notebooks/04_parameter_server.ipynb, 05, 05b, 06, 12,
13 and 14 (e.g. notebooks/12_scalability.ipynb).
"""
from __future__ import annotations

import re

from ddnb._checks import Checks

_OVERRUNS = re.compile(r"(\d+) overruns in \d+ syncs")


def overruns(emulation) -> int:
    """Overruns reported by `ddnb.emulate.summary` lines: a line, a result holding one under
    "emulation", or a list of those (every line counted)."""
    if isinstance(emulation, dict):
        emulation = emulation.get("emulation", "")
    if isinstance(emulation, (list, tuple)):
        return sum(overruns(e) for e in emulation)
    return sum(int(n) for n in _OVERRUNS.findall(str(emulation)))


def without_overruns(run, slowdown, *, emulation=lambda out: out, factor: float = 2.0, tries: int = 3,
                     say=print, refuse: bool = False):
    """run(slowdown) -> out, where `slowdown` is a Profile (passed on with its slowdown
    raised: `profile.with_(slowdown=...)`) or a number. While `emulation(out)` reports
    overruns, say so and run again at `factor` times the slowdown; after `tries` runs that
    all overran, say so and return the last (or, with `refuse`, raise RuntimeError), naming
    the slowdowns and counts."""
    with Checks("without_overruns") as check:
        check.rule(callable(run), f"run={run!r}: need a function of the profile (or slowdown)")
        check.number("factor", factor, min=1.01)
        check.integer("tries", tries, min=1)
    seen = []
    for k in range(tries):
        out = run(slowdown)
        n = overruns(emulation(out))
        if n == 0:
            return out
        current = getattr(slowdown, "slowdown", slowdown)
        seen.append(f"{n} at {current:g}x")
        if k == tries - 1:
            break
        nxt = current * factor
        say(f"{n} overruns at slowdown {current:g}x (real work outran its model): running again at {nxt:g}x")
        slowdown = slowdown.with_(slowdown=nxt) if hasattr(slowdown, "with_") else nxt
    why = (f"every run overran ({', '.join(seen)}): this machine is too busy for these times; "
           f"run it on a quiet machine or start from a higher slowdown")
    if refuse:
        raise RuntimeError(why)
    say(f"WARNING: {why}. The times below are WRONG (too slow where a rank overran).")
    return out
