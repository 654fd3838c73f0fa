"""Calibration: what one operation and one message really cost on this machine, measured
once, so that an emulated cluster's default slowdown comes from this machine and not from
a guess (`ddnb.runtime.placement.default_slowdown`).

    python -m ddnb.runtime.calibrate            # measure (about 3 s) and print; cached
    python -m ddnb.runtime.calibrate --json     # the same as JSON

It measures, with one intra-op thread (what each of several ranks on a few cores gets):

- `flops`: float32 FLOP/s of a 256 x 256 x 256 matmul (2 n^3 FLOPs each);
- `bandwidth`: bytes/s of a 32 MiB copy (read + write: larger than the caches);
- `op_seconds`: real seconds of one small torch op (a kernel's launch on the CPU: what a
  roofline charge of a tiny op cannot cover);
- `message_seconds`: real seconds per message of ddnb's emulated message layer
  (`ddnb.emulate.messages`: header, payload, bookkeeping), from a ping-pong of 256-byte
  messages between two ranks of an emulated `ddnb.testing.World` at a slowdown so small
  that nothing sleeps: the real cost the model's alpha must cover;
- `wake_late`: the 95th percentile of how late a sleep to a deadline 2 ms away wakes.

An emulated run keeps real time in step with its virtual clocks only where, for each
piece of work, real seconds <= emulated seconds x slowdown. So the slowdown this machine
needs for a profile is the largest ratio of real to emulated cost, compute (the profile's
FLOP/s and memory bandwidth against this core's) and messages (message_seconds against
the smallest alpha), times the ranks sharing each core (`placement.default_slowdown`).

The result is cached in ~/.cache/ddnb (or $DDNB_CACHE) per host and boot, so a machine
measures once; `--refresh` measures again. The measurement runs as its own program,
started by `ddnb.runtime.machine.machine_costs` the first time a default slowdown is asked for.
Taught in `notebooks/05_allreduce.ipynb` (the emulator's section).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from ddnb.runtime.machine import cache_key, cores, read_costs, write_costs



def _rate(fn, seconds: float = 0.1) -> float:
    """Seconds per call of fn, the best of 3 windows of about `seconds`/3 each."""
    fn()
    best = float("inf")
    for _ in range(3):
        calls, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds / 3:
            fn()
            calls += 1
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


def compute_costs() -> dict:
    """flops, bandwidth, op_seconds and wake_late of this process, on one intra-op thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = torch.randn(256, 256), torch.randn(256, 256)
        x, y = torch.empty(1 << 23), torch.empty(1 << 23)          # 32 MiB each
        small = torch.zeros(8)
        flops = 2 * 256 ** 3 / _rate(lambda: a @ b)
        bandwidth = 2 * x.numel() * x.element_size() / _rate(lambda: y.copy_(x))
        op_seconds = _rate(lambda: small.add_(1.0))
    finally:
        torch.set_num_threads(threads)
    late = []
    for _ in range(25):
        deadline = time.perf_counter() + 2e-3
        time.sleep(2e-3)
        late.append(max(0.0, time.perf_counter() - deadline))
    late.sort()
    return {"flops": flops, "bandwidth": bandwidth, "op_seconds": op_seconds,
            "wake_late": late[int(0.95 * (len(late) - 1))]}


def _pingpong(rounds: int) -> float:
    """On each of 2 ranks: seconds per message of `rounds` round trips of 256 bytes through
    ddnb's message layer (emulated: the World plugs its transport in)."""
    from ddnb.collectives import p2p

    rank, t = p2p.group_rank(), torch.zeros(64)
    peer = 1 - rank
    for k in range(rounds + 10):
        if k == 10:
            t0 = time.perf_counter()
        if rank == 0:
            p2p.send(t, peer)
            p2p.recv(t, peer)
        else:
            p2p.recv(t, peer)
            p2p.send(t, peer)
    return (time.perf_counter() - t0) / (2 * rounds)


def message_seconds(rounds: int = 200) -> float:
    """Real seconds per message of the emulated message layer between two processes."""
    from ddnb.emulate.profile import custom
    from ddnb.runtime.world import World

    profile = custom(alpha=1e-6, bandwidth=1e12, slowdown=1e-6, name="calibration")
    with World(2, timeout=60, emulate=profile) as world:
        return statistics.median(world.run(_pingpong, rounds))


def measure() -> dict:
    """Every field of FIELDS, measured now, with the machine's description."""
    out = compute_costs()
    out["message_seconds"] = message_seconds()
    out.update(key=cache_key(), cores=cores(), measured_at=time.time())
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ddnb.runtime.calibrate", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="print the costs as JSON")
    p.add_argument("--refresh", action="store_true", help="measure again even if this boot has measured")
    p.add_argument("--quiet", action="store_true", help="print nothing (write the cache only)")
    args = p.parse_args(argv)
    costs = None if args.refresh else read_costs()
    if costs is None:
        costs = measure()
        write_costs(costs)
    if args.quiet:
        return 0
    if args.json:
        print(json.dumps(costs, indent=1))
    else:
        print(f"this machine ({costs['key']}): {costs['flops'] / 1e9:.1f} GFLOP/s and "
              f"{costs['bandwidth'] / 1e9:.1f} GB/s on one thread, {costs['op_seconds'] * 1e6:.1f} us per small op, "
              f"{costs['message_seconds'] * 1e6:.0f} us per emulated message, sleeps wake "
              f"{costs['wake_late'] * 1e3:.2f} ms late (p95)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
