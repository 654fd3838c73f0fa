"""The ring all-reduce timed on an emulated cluster (`ddnb.emulate`): real processes send the
ring's real messages, the emulator charges each one alpha + n / B of its link and each add
its roofline time on the profile's device, and the time is the slowest rank's, from a
barrier to the end of one call after a warm-up call (`ddnb.bench.allreduce.allreduce_rows`).
Nothing here reads the formula the times are compared with, `ddnb.cost.allreduce_time`:

    T_ring = 2(N-1) alpha + 2(N-1)/N S / B + (N-1)/N S gamma

(Thakur, Rabenseifner & Gropp 2005, Sec. 4; Patarasuk & Yuan 2009). `ring_terms` separates
its two link terms by measurement: the latency term is the time of an all-reduce of one
float per rank (its 2(N-1) messages carry next to nothing), the bandwidth term is what S
bytes add to that. Taught in `notebooks/12_scalability.ipynb`:

    emulated_allreduce(8, [12_595_200], get_profile("ib").with_(slowdown=3000))["times"]
    ring_terms([2, 3, 4], 625_000, custom(alpha=20e-6, bandwidth=12.5e9))
"""
from __future__ import annotations

from ddnb._checks import Checks


def _check_sizes(check: Checks, sizes) -> None:
    check.rule(isinstance(sizes, (list, tuple)) and len(sizes) >= 1
               and all(isinstance(s, int) and not isinstance(s, bool) and s >= 4 and s % 4 == 0 for s in sizes),
               f"sizes={sizes!r}: need a list of byte counts, each a positive multiple of 4 (float32)")


def emulated_allreduce(workers: int, sizes, profile, algorithm: str = "ring", timeout: float = 300) -> dict:
    """One all-reduce of each of `sizes` bytes (float32) by ddnb's `algorithm` (or "torch") on
    a `ddnb.testing.World` of `workers` processes emulated as `profile` (a Profile, used as
    given, or a name, its slowdown scaled to this machine's cores). Returns {"times": {size:
    emulated seconds}, "emulation": the run's summary line (overruns: raise the slowdown,
    `ddnb.emulate.without_overruns`), "profile": its name, "workers"}."""
    from ddnb.bench.allreduce import FROM_SCRATCH, allreduce_rows
    from ddnb.emulate import summary
    from ddnb.testing import World

    with Checks("emulated_allreduce") as check:
        check.integer("workers", workers, min=1)
        _check_sizes(check, sizes)
        check.choice("algorithm", algorithm, FROM_SCRATCH + ("torch",))
        check.rule(profile is not None, "profile=None: an emulated time needs a profile (ddnb.emulate.get_profile)")
    with World(workers, timeout=timeout, emulate=profile) as world:
        rows = allreduce_rows(world, list(sizes), [algorithm])
        emulation = summary(world.emulation_reports())
        name = world.emulate.name
    return {"times": {r["size"]: r["time"] for r in rows}, "emulation": emulation, "profile": name,
            "workers": workers}


def ring_terms(workers, nbytes: int, profile, timeout: float = 300) -> list[dict]:
    """Per N in `workers` (a World each, emulated as `profile`): {"workers", "latency" (the
    ring all-reduce of one float per rank), "bandwidth" (the all-reduce of `nbytes` less the
    latency), "total" (of `nbytes`), "emulation"}, emulated seconds."""
    with Checks("ring_terms") as check:
        check.integers("workers", workers, min=2)
        if check.integer("nbytes", nbytes, min=4) and isinstance(workers, (list, tuple)) and workers:
            check.rule(nbytes % 4 == 0 and all(nbytes > 4 * n for n in workers if isinstance(n, int)),
                       f"nbytes={nbytes}: need a multiple of 4 above 4 x the most workers "
                       f"({4 * max((n for n in workers if isinstance(n, int)), default=0)}), the one-float-per-rank "
                       f"all-reduce")
    rows = []
    for n in workers:
        got = emulated_allreduce(n, [4 * n, nbytes], profile, timeout=timeout)
        small, total = got["times"][4 * n], got["times"][nbytes]
        rows.append({"workers": n, "latency": small, "bandwidth": total - small, "total": total,
                     "emulation": got["emulation"]})
    return rows
