"""At what link speed does gradient compression pay? The same data-parallel training with
each compression hook (`ddnb.compression`) on emulated clusters that differ only in their
link's bandwidth (`ddnb.emulate`; one World, re-emulated per bandwidth with
`World.emulate_as`), its emulated step time beside the uncompressed one's.

    rows = link_sweep(["none", "powersgd:4", "topk"], [1e8, 1e9, 1e10, 1e11])
    pays_below(rows)        # {method: the fastest link on which it still beats "none"}

A compressed step trades bytes on the link for work on the device: PowerSGD's matmuls and
orthogonalization, top-k's selection and its all-gather, sign's packing. The emulated
device charges each operation its roofline time plus a kernel's launch cost
(`Profile.op_overhead`, 5 us here: the order of a CUDA launch), so a hook of many small
operations costs tens of microseconds whatever the link; the link's saving is bytes / B.
Compression pays below the bandwidth where the two meet (Agarwal et al., "On the utility
of gradient compression in distributed training systems", MLSys 2022, measured the same
trade on real clusters: on fast links most methods did not pay). The times come out of the
runs: real hooks, real messages paced to the profile, never this formula.
Taught in `notebooks/14_precision_compression.ipynb`.
"""
from __future__ import annotations

from ddnb._checks import Checks

DEVICE = dict(peak_flops=8.1e12, efficiency=0.4, memory_bandwidth=320e9, op_overhead=5e-6)   # a T4 (10gbe's)


def link_profile(bandwidth: float, alpha: float = 10e-6, slowdown: float = 100.0):
    """The emulated cluster of the sweep: one T4 per host (`DEVICE`), links of `bandwidth`
    bytes/s and latency `alpha`."""
    from ddnb.emulate import custom

    return custom(alpha=alpha, bandwidth=bandwidth, slowdown=slowdown, name=f"T4s, {bandwidth / 1e9:g} GB/s",
                  **{k: v for k, v in DEVICE.items() if k != "op_overhead"}).with_(op_overhead=DEVICE["op_overhead"])


def rank_step_times(methods, steps: int, start: int, ratio: float) -> dict:
    """On every rank: {method: median step time} of `train_compressed` (the slowest rank's)."""
    import torch
    import torch.distributed as dist

    from ddnb.bench.compress import parse_method
    from ddnb.compression.train import train_compressed
    from ddnb.emulate import uncounted

    out = {}
    for text in methods:
        name, kw = parse_method(text)
        if name == "powersgd":
            kw.update(start=start)
        t = torch.tensor([train_compressed(name, steps=steps, ratio=ratio, **kw)["step_time"]], dtype=torch.float64)
        with uncounted():                       # bookkeeping, after the timed steps
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        out[text] = t.item()
    return out


def link_sweep(methods=("none", "fp16", "powersgd:4", "topk", "sign"), bandwidths=(1e8, 1e9, 1e10, 1e11),
               workers: int = 4, steps: int = 8, start: int = 2, ratio: float = 0.01, alpha: float = 10e-6,
               slowdown: float = 100.0, timeout: float = 600) -> list[dict]:
    """Rows {method, bandwidth (bytes/s), step_time (emulated s), speedup (none's step /
    this one's), emulation (the run's summary)} for each bandwidth and method."""
    from ddnb.bench.compress import parse_method
    from ddnb.emulate import summary
    from ddnb.testing import World

    with Checks("link_sweep") as check:
        check.integer("workers", workers, min=2)
        check.integer("steps", steps, min=start + 2, why=f" (start={start} plain steps, then compressed ones)")
        check.rule("none" in methods, f"methods={list(methods)}: need 'none', the baseline")
        for b in bandwidths:
            check.number("bandwidth", b, positive=True)
        for m in methods:
            try:
                parse_method(m)
            except ValueError as e:
                check.rule(False, str(e))
    profiles = [link_profile(b, alpha, slowdown) for b in bandwidths]
    rows = []
    with World(workers, timeout=timeout, emulate=profiles[0]) as world:
        for b, profile in zip(bandwidths, profiles):
            world.emulate_as(profile)
            times = world.run(rank_step_times, list(methods), steps, start, ratio)[0]
            emulation = summary(world.emulation_reports())
            rows += [{"method": m, "bandwidth": b, "step_time": t, "speedup": times["none"] / t,
                      "emulated": profile.name, "emulation": emulation} for m, t in times.items()]
    return rows


def pays_below(rows: list[dict]) -> dict:
    """{method: the largest bandwidth of the sweep at which its step beats "none"'s, or
    None if it never does}."""
    methods = dict.fromkeys(r["method"] for r in rows if r["method"] != "none")
    out = {}
    for m in methods:
        paying = [r["bandwidth"] for r in rows if r["method"] == m and r["speedup"] > 1]
        out[m] = max(paying) if paying else None
    return out
