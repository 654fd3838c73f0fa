"""`python -m ddnb.bench diloco`: DDP, DiLoCo and streaming DiLoCo on the same token budget
(`ddnb.decentralized.diloco`, the Markov-chain task of `ddnb.decentralized.markov`) on an
emulated cluster of T4s joined by a link of the bandwidth asked for.

Each method runs on one ddnb.testing.World of gloo processes in emulated time
(`ddnb.emulate`; the device and its per-operation cost are `ddnb.bench.compress_links`'),
every exchange an all-reduce whose bytes are the ring's real messages. Rows {method,
inner_steps, fragments, bf16, bytes_sent, peak_bytes_per_sync, syncs, final_loss,
emulated_time, link_gbps, overruns, loss_curve} per method and link: bytes per worker (the
busiest rank), the final loss of the global parameters on a held-out batch, the slowest
rank's emulated seconds, and the run's overruns (0: every time is the model's).

    python -m ddnb.bench diloco --workers 4 --link 0.1 --json
    python -m ddnb.bench diloco --link 0.1,10 --inner-steps 50 --fragments 4 --bf16

Taught in `notebooks/16b_slow_link.ipynb`.
"""
from __future__ import annotations

import argparse
import json
import sys

from ddnb.bench.args import _at_least, _load

METHODS = ("ddp", "diloco", "streaming_diloco")


def _links(text: str) -> list[float]:
    try:
        got = [float(a) for a in text.split(",") if a.strip()]
    except ValueError:
        got = []
    if not got or min(got) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: need GB/s, a positive number or a comma list (0.1,10)")
    return got


def add_parser(sub) -> None:
    p = sub.add_parser("diloco", help="DDP vs DiLoCo vs streaming DiLoCo: bytes, final loss, emulated time",
                       description=__doc__.split("\n\n")[1])
    p.add_argument("--workers", type=_at_least(2, why=" workers (one worker synchronizes with no one)"), default=4,
                   help="gloo processes (default 4)")
    p.add_argument("--link", type=_links, default=[0.1], metavar="GB/S",
                   help="the link's bandwidth in GB/s, or a comma list (default 0.1; e.g. 0.1,10)")
    p.add_argument("--steps", type=_at_least(1), default=500, help="inner steps per worker (default 500)")
    p.add_argument("--inner-steps", type=_at_least(1), default=50, help="H, DiLoCo's inner steps (default 50)")
    p.add_argument("--fragments", type=_at_least(1), default=4, help="streaming DiLoCo's fragments (default 4)")
    p.add_argument("--overlap", type=_at_least(0), default=1,
                   help="streaming DiLoCo: inner steps an all-reduce overlaps (default 1)")
    p.add_argument("--bf16", action="store_true", help="streaming DiLoCo all-reduces its deltas in bfloat16")
    p.add_argument("--slowdown", type=_at_least(0.0, float), default=None,
                   help="real seconds per emulated second (default 2 x workers / cores, at least 2)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON (the header goes to stderr)")
    p.add_argument("--timeout", type=_at_least(0.0, float), default=600,
                   help="seconds before a stuck world is killed (default 600)")
    p.set_defaults(run=run, parser=p)


def _rank_run(method: str, config) -> dict:
    """On every rank: one method's run, its parameters left behind (the rows need none)."""
    from ddnb.decentralized.diloco import RUNS

    out = RUNS[method](config)
    out.pop("params")
    return out


def diloco_benchmark(workers: int = 4, links=(0.1,), config=None, slowdown: float | None = None,
                     timeout: float = 600, methods=METHODS) -> list[dict]:
    """The rows (see the module docstring) for each link (GB/s) and method, on one World."""
    from ddnb.bench.compress_links import link_profile
    from ddnb.decentralized.diloco import DiLoCoConfig
    from ddnb.emulate import overruns, summary
    from ddnb.runtime.placement import scaled_slowdown
    from ddnb.testing import World

    config = (config or DiLoCoConfig()).validate(workers)
    slowdown = slowdown or scaled_slowdown(2.0, workers)
    rows = []
    profiles = [link_profile(g * 1e9, slowdown=slowdown) for g in links]
    with World(workers, timeout=timeout, emulate=profiles[0]) as world:
        for gbps, profile in zip(links, profiles):
            for method in methods:
                world.emulate_as(profile)        # a fresh clock and counts per run
                ranks = world.run(_rank_run, method, config)
                emulation = summary(world.emulation_reports())
                every = max(1, config.steps // 50)
                curve = [sum(r["losses"][s] for r in ranks) / len(ranks) for s in range(0, config.steps, every)]
                rows.append({"method": method, "inner_steps": ranks[0]["inner_steps"],
                             "fragments": ranks[0]["fragments"], "bf16": config.bf16 and method != "ddp",
                             "bytes_sent": max(r["bytes_sent"] for r in ranks),
                             "peak_bytes_per_sync": max(r["peak_bytes_per_sync"] for r in ranks),
                             "syncs": ranks[0]["syncs"], "final_loss": ranks[0]["final_loss"],
                             "emulated_time": max(r["emulated_time"] for r in ranks), "link_gbps": gbps,
                             "overruns": overruns(emulation), "bytes_from": ranks[0]["bytes_from"],
                             "entropy_rate": ranks[0]["entropy_rate"], "loss_curve_every": every,
                             "loss_curve": curve, "emulation": emulation})
    return rows


def table(rows: list[dict]) -> str:
    """The rows as a text table, with each method's bytes and peak against DDP's on its link."""
    ddp = {r["link_gbps"]: r for r in rows if r["method"] == "ddp"}
    lines = [f"{'link':>8} {'method':<17} {'H':>4} {'F':>2} {'bytes sent':>13} {'x fewer':>8} {'peak/sync':>11} "
             f"{'peak x':>7} {'final loss':>10} {'emulated s':>11} {'overruns':>8}"]
    for r in rows:
        base = ddp.get(r["link_gbps"])
        fewer = f"{base['bytes_sent'] / r['bytes_sent']:.1f}" if base and r["bytes_sent"] else "-"
        peak = f"{base['peak_bytes_per_sync'] / r['peak_bytes_per_sync']:.1f}" if base and r["peak_bytes_per_sync"] \
            else "-"
        lines.append(f"{r['link_gbps']:>5g}GB/s {r['method']:<17} {r['inner_steps']:>4} {r['fragments']:>2} "
                     f"{r['bytes_sent']:>13,} {fewer:>8} {r['peak_bytes_per_sync']:>11,} {peak:>7} "
                     f"{r['final_loss']:>10.4f} {r['emulated_time']:>11.4f} {r['overruns']:>8}")
    return "\n".join(lines)


def run(parser, args) -> int:
    from ddnb.decentralized.diloco import DiLoCoConfig

    config = DiLoCoConfig(steps=args.steps, inner_steps=args.inner_steps, fragments=args.fragments,
                          overlap=args.overlap, bf16=args.bf16)
    try:
        config.validate(args.workers)
    except ValueError as e:
        parser.error(str(e))
    out = sys.stderr if args.json else sys.stdout
    print(f"DDP, DiLoCo (H={args.inner_steps}) and streaming DiLoCo (F={args.fragments}, overlap {args.overlap}"
          f"{', bf16 deltas' if args.bf16 else ''}) on {args.workers} emulated T4s, {args.steps} inner steps of "
          f"{config.batch_size}x{config.length} tokens per worker (the same token budget), links "
          f"{', '.join(f'{g:g}' for g in args.link)} GB/s; {_load()}", file=out, flush=True)
    rows = diloco_benchmark(args.workers, args.link, config, args.slowdown, args.timeout)
    print(f"{rows[-1]['emulation']}; overruns in all runs: {sum(r['overruns'] for r in rows)}; bytes counted from "
          f"{rows[0]['bytes_from']}; entropy rate of the chain (the loss floor) {rows[0]['entropy_rate']:.4f}",
          file=out)
    if args.json:
        print(json.dumps([{k: v for k, v in r.items() if k != "emulation"} for r in rows], indent=1))
    else:
        print(table(rows))
    return 0
