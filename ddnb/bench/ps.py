"""`python -m ddnb.bench ps`: the BSP step of a central parameter server (one or more
shards) against the ring all-reduce, per number of workers
(`ddnb.parameter_server.saturation`, run by `ddnb.bench.parameter_server`).

The same synchronous training three ways on one ddnb.testing.World of gloo processes:
k servers (ranks 0..k-1, each holding 1/k of the parameters) and N workers, or the N
workers with a ring all-reduce and no server. Rows {strategy, servers, workers,
step_time} (the median step after the first, the slowest rank's), and with --emulate
PROFILE the model's {model_step_time, error}: the server's link carries N S each way per
step, so its step grows with N (and shrinks with k), while the ring's does not.

    python -m ddnb.bench ps --emulate 10gbe --workers 1,2,4,8 --servers 1,2 --json

Taught in `notebooks/04_parameter_server.ipynb`.
"""
from __future__ import annotations

import json
import sys

from ddnb.bench.args import _at_least, _ints, _load, add_emulate_arguments, emulated


def add_parser(sub) -> None:
    p = sub.add_parser("ps", help="parameter server against ring all-reduce: step time per worker count",
                       description=__doc__.split("\n\n")[1])
    p.add_argument("--workers", type=_ints, default=[1, 2, 4, 8], help="comma list (default 1,2,4,8)")
    p.add_argument("--servers", type=_ints, default=[1, 2], help="comma list of server shards (default 1,2)")
    p.add_argument("--width", type=_at_least(1), default=1024,
                   help="hidden width of the MLP 64-WIDTH-64-10 trained on digits (default 1024: 0.53 MB)")
    p.add_argument("--steps", type=_at_least(2), default=4, help="steps per run; the first is not counted (default 4)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON (the header goes to stderr)")
    p.add_argument("--timeout", type=_at_least(0.0, float), default=600,
                   help="seconds before a stuck world is killed (default 600)")
    add_emulate_arguments(p)
    p.set_defaults(run=run, parser=p)


def run(parser, args) -> int:
    from functools import partial

    from ddnb.bench.parameter_server import server_vs_ring, table
    from ddnb.data import digits
    from ddnb.models import mlp

    profile = emulated(parser, args, ranks=max(args.servers) + max(args.workers))   # the World's ranks
    out = sys.stderr if args.json else sys.stdout
    print(f"BSP on digits, MLP 64-{args.width}-64-10, batch 32 per worker, {args.steps} steps per run; "
          f"{_load()}", file=out, flush=True)
    result = server_vs_ring(profile, partial(mlp, (64, args.width, 64, 10)), digits(seed=0)[0], args.workers,
                            args.servers, steps=args.steps, timeout=args.timeout)
    print(f"{result['profile']}; parameters {result['param_bytes']:,} bytes; server and ring runs end with the same "
          f"parameters: {result['same_params']}", file=out)
    print(result["emulation"], file=out)
    print(json.dumps(result["rows"], indent=1) if args.json else table(result))
    return 0
