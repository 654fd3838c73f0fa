"""`python -m ddnb.bench BENCHMARK ...` and `ddnb bench BENCHMARK ...`: one subparser per
benchmark turns a command line into a call of its module and prints a table (or --json).

    python -m ddnb.bench allreduce --workers 4 --sizes 64KB..64MB --fit   # ddnb.bench.allreduce
    python -m ddnb.bench alltoall --workers 4 --sizes 4KB..16MB          # ddnb.bench.alltoall
    python -m ddnb.bench dp --workers 2 --models many_small              # ddnb.bench.dp
    python -m ddnb.bench compress --workers 4 --json                     # ddnb.bench.compress
    python -m ddnb.bench ps --emulate 10gbe --workers 1,2,4,8            # ddnb.bench.ps
    python -m ddnb.bench pipeline --schedules 1f1b,zbh1,zbv --emulate ib # ddnb.bench.pipeline
    python -m ddnb.bench plan --paper megatron2021 --json                # ddnb.bench.plan (formulas only)
    python -m ddnb.bench diloco --workers 4 --link 0.1 --json            # ddnb.bench.diloco

Taught in `notebooks/05_allreduce.ipynb` and `notebooks/06_data_parallelism.ipynb` (`ps` in
`notebooks/04_parameter_server.ipynb`, `pipeline` in `notebooks/09_pipeline_parallelism.ipynb`
and `notebooks/09b_zero_bubble.ipynb`).
"""
from __future__ import annotations

import argparse
import json
import sys

from ddnb.bench import allreduce as ar
from ddnb.bench import diloco, plan, ps
from ddnb.bench.allreduce import ALLREDUCE_ALGORITHMS, GB, format_size, format_time, parse_sizes
from ddnb.bench.args import (_at_least, _ints, _load, _names, _sizes, add_emulate_arguments, emulated,
                             run_without_overruns)


def _add_timing_arguments(p) -> None:
    """--json, --seconds, --repeats, --timeout, -v: what every collective's benchmark takes."""
    p.add_argument("--json", action="store_true", help="print the rows as JSON (the header goes to stderr)")
    p.add_argument("--seconds", type=_at_least(0.0, float), default=0.3,
                   help="target seconds per measurement, all windows together (default 0.3)")
    p.add_argument("--repeats", type=_at_least(1), default=3,
                   help="windows per measurement; the median is reported (default 3)")
    p.add_argument("--timeout", type=_at_least(0.0, float), default=300,
                   help="seconds before a stuck world is killed (default 300)")
    p.add_argument("-v", "--verbose", action="store_true", help="log each measurement to stderr")


def _cmd_allreduce(parser, args) -> int:
    from ddnb.runtime.horovod import horovod_available

    emulate = emulated(parser, args)
    algorithms = args.algorithms or [a for a in ALLREDUCE_ALGORITHMS
                                     if a != "horovod" or (horovod_available() and emulate is None)]
    unknown = [a for a in algorithms if a not in ALLREDUCE_ALGORITHMS]
    if unknown:
        parser.error(f"unknown algorithms {unknown}; known: {', '.join(ALLREDUCE_ALGORITHMS)}")
    if "horovod" in algorithms and not horovod_available():
        parser.error("--algorithms includes horovod, but Horovod with PyTorch is not installed")
    if "horovod" in algorithms and emulate is not None:
        parser.error("--algorithms includes horovod, but Horovod is not emulated")
    out = sys.stderr if args.json else sys.stdout
    log = (lambda s: print(s, file=sys.stderr, flush=True)) if args.verbose else None
    if emulate is not None:
        print(f"{emulate}: every time below is emulated seconds of this profile, not this machine's; "
              "torch's all-reduce is timed by the messages of ddnb's ring", file=out, flush=True)
    print(f"all-reduce of float32 sums on {args.workers} gloo processes (ddnb.testing.World), "
          f"sizes {format_size(args.sizes[0])}..{format_size(args.sizes[-1])}, "
          + ("one call per measurement after a warm-up (emulated time does not vary with load)" if emulate else
             f"~{args.seconds} s per measurement (median of {args.repeats} windows)") + f"; {_load()}",
          file=out, flush=True)
    rows, model = ar.allreduce_benchmark(args.workers, args.sizes, algorithms, args.seconds, args.repeats,
                                         fit=args.fit, timeout=args.timeout, log=log, emulate=emulate)
    link = model["link"]
    print(f"done; {_load()} (other processes on these cores slow every measurement); "
          f"{rows[0]['threads']} intra-op thread(s) per rank", file=out)
    print(f"point-to-point link, ping-pong ranks 0<->1 at {format_size(link['size'])}: "
          f"{link['bw']:.3f} GB/s one way ({format_time(link['time'])}) = the busbw ceiling", file=out)
    for pattern, (alpha, beta) in model.get("alpha_beta", {}).items():
        print(f"alpha-beta fit to {pattern} (relative least squares): alpha = {alpha * 1e6:.1f} us, "
              f"beta = {beta * 1e9:.3f} ns/B ({1 / beta / GB if beta else float('inf'):.2f} GB/s)", file=out)
    if args.fit:
        print(f"local add, all ranks at once: gamma = {model['gamma'] * 1e9:.3f} ns/B. model: ring and "
              f"halving_doubling on the sendrecv fit, naive and tree on the ping-pong fit; "
              f"'pp error': every algorithm on the ping-pong fit", file=out)
    if model["emulation"]:
        print(model["emulation"], file=out)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(ar.allreduce_table(rows))
    return 0


def build_parser(prog: str = "python -m ddnb.bench") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="ddnb benchmarks")
    sub = parser.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    p = sub.add_parser("allreduce", help="all-reduce time, algbw and busbw per size and algorithm",
                       description=ar.__doc__.split("\n\n")[2])
    p.add_argument("--workers", default=4, help="gloo processes (default 4)",
                   type=_at_least(2, why=" workers (an all-reduce over one rank moves nothing)"))
    p.add_argument("--sizes", type=_sizes, default=parse_sizes("4KB..64MB"),
                   help="LOW..HIGH (powers of 2 from LOW to HIGH) or a comma list; KB = 1024 bytes "
                        "(default 4KB..64MB)")
    p.add_argument("--algorithms", type=lambda s: list(dict.fromkeys(a.strip() for a in s.split(",") if a.strip())),
                   help=f"comma list of {', '.join(ALLREDUCE_ALGORITHMS)} (default: all; horovod if installed)")
    p.add_argument("--fit", action="store_true", help="fit alpha, beta (ping-pong, sendrecv) and gamma (local "
                                                      "add) and print the model's time beside the measured one")
    _add_timing_arguments(p)
    add_emulate_arguments(p)
    p.set_defaults(run=_cmd_allreduce, parser=p)
    _add_alltoall_parser(sub)
    _add_dp_parser(sub)
    _add_pipeline_parser(sub)
    _add_compress_parser(sub)
    ps.add_parser(sub)
    plan.add_parser(sub)
    diloco.add_parser(sub)
    return parser


# ---------------------------------------------------------------- alltoall (ddnb/bench/alltoall.py)
def _add_alltoall_parser(sub) -> None:
    from ddnb.bench.alltoall import ALLTOALL_ALGORITHMS
    from ddnb.bench.alltoall import __doc__ as a2a_doc

    p = sub.add_parser("alltoall", help="all-to-all time, algbw and busbw per size: pairwise, bruck, torch",
                       description=a2a_doc.split("\n\n")[2])
    p.add_argument("--workers", default=4, help="gloo processes (default 4)",
                   type=_at_least(2, why=" workers (an all-to-all over one rank moves nothing)"))
    p.add_argument("--sizes", type=_sizes, default=parse_sizes("4KB..16MB"),
                   help="bytes of one rank's input: LOW..HIGH (powers of 2) or a comma list; KB = 1024 bytes "
                        "(default 4KB..16MB)")
    p.add_argument("--algorithms", type=_names(ALLTOALL_ALGORITHMS), default=list(ALLTOALL_ALGORITHMS),
                   help=f"comma list of {', '.join(ALLTOALL_ALGORITHMS)} (default: all)")
    _add_timing_arguments(p)
    p.set_defaults(run=_cmd_alltoall, parser=p)


def _cmd_alltoall(parser, args) -> int:
    from ddnb.bench.alltoall import alltoall_benchmark

    small = [format_size(s) for s in args.sizes if s < 4 * args.workers]
    if small:
        parser.error(f"--sizes {', '.join(small)} below 4 * workers = {4 * args.workers} bytes: every rank "
                     f"needs at least one float32 element from every rank")
    out = sys.stderr if args.json else sys.stdout
    log = (lambda s: print(s, file=sys.stderr, flush=True)) if args.verbose else None
    print(f"all-to-all of float32 on {args.workers} gloo processes (ddnb.testing.World), equal splits, "
          f"sizes {format_size(args.sizes[0])}..{format_size(args.sizes[-1])} per rank, ~{args.seconds} s per "
          f"measurement (median of {args.repeats} windows); {_load()}", file=out, flush=True)
    rows = alltoall_benchmark(args.workers, args.sizes, args.algorithms, args.seconds, args.repeats,
                              timeout=args.timeout, log=log)
    print(f"done; {_load()} (other processes on these cores slow every measurement); "
          f"{rows[0]['threads']} intra-op thread(s) per rank; busbw = algbw * (N-1)/N", file=out)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(ar.allreduce_table(rows))
    return 0


# ---------------------------------------------------------------- dp (ddnb/bench/dp.py)
def _add_dp_parser(sub) -> None:
    from ddnb.bench.dp import MODELS, STRATEGIES
    from ddnb.bench.dp import __doc__ as dp_doc

    p = sub.add_parser("dp", help="data-parallel step time per strategy (naive, bucketed, ddp, horovod)",
                       description=dp_doc.split("\n\n")[2])
    p.add_argument("--workers", default=[2], type=_ints,
                   help="gloo processes, or a comma list for a weak-scaling run with efficiency T(1)/T(N) "
                        "(e.g. 1,2,4,8; default 2)")
    p.add_argument("--models", type=_names(tuple(MODELS)), default=list(MODELS),
                   help=f"comma list of {', '.join(MODELS)} (default: both)")
    p.add_argument("--strategies", type=_names(STRATEGIES), default=None,
                   help=f"comma list of {', '.join(STRATEGIES)} (default: all; horovod if installed)")
    p.add_argument("--batch", type=_at_least(1), default=32, help="samples per rank per step (default 32)")
    p.add_argument("--steps", type=_at_least(1), default=20, help="timed steps per strategy (default 20)")
    p.add_argument("--warmup", type=_at_least(0), default=3, help="untimed steps first (default 3)")
    p.add_argument("--rounds", type=_at_least(1), default=4,
                   help="the strategies take turns this many times, steps/rounds steps each (default 4)")
    p.add_argument("--bucket-mb", type=_at_least(0.0, float), default=25.0,
                   help="BucketedDataParallel's bucket size in MB (default 25, as DDP's)")
    p.add_argument("--allreduce", default="torch",
                   help="all-reduce of naive and bucketed: torch or a ddnb.collectives algorithm (default torch)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON (the header goes to stderr)")
    p.add_argument("--timeout", type=_at_least(0.0, float), default=600,
                   help="seconds before a stuck world is killed (default 600)")
    p.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    add_emulate_arguments(p)
    p.set_defaults(run=_cmd_dp, parser=p)


def _cmd_dp(parser, args) -> int:
    from ddnb.bench.dp import STRATEGIES, add_model_columns, dp_benchmark, dp_scaling, dp_scaling_table, dp_table
    from ddnb.data_parallel.naive import allreduce_names
    from ddnb.runtime.horovod import horovod_available

    emulate = emulated(parser, args)
    scaling = len(args.workers) > 1
    if not scaling and args.workers[0] < 2:
        parser.error("--workers: need an integer >= 2 workers (data parallelism over one rank syncs nothing), "
                     "or a comma list such as 1,2,4 for a scaling run")
    strategies = args.strategies or [s for s in STRATEGIES
                                     if s != "horovod" or (horovod_available() and emulate is None and not scaling)]
    if scaling and "horovod" in strategies:
        parser.error("--strategies: horovod is measured at one worker count only (it needs a world of its own)")
    if "horovod" in strategies and not horovod_available():
        parser.error("--strategies includes horovod, but Horovod with PyTorch is not installed")
    if "horovod" in strategies and emulate is not None:
        parser.error("--strategies includes horovod, but Horovod is not emulated")
    if emulate is not None and args.allreduce != "torch":
        parser.error("--allreduce: an emulated cluster runs the buckets' all-reduce as torch's, timed by its "
                     "ring's messages; leave --allreduce torch")
    if args.allreduce not in allreduce_names():
        parser.error(f"--allreduce {args.allreduce!r} is not one of {', '.join(allreduce_names())}")
    out = sys.stderr if args.json else sys.stdout
    log = (lambda s: print(s, file=sys.stderr, flush=True)) if args.verbose else None
    print(f"data-parallel training step on {','.join(map(str, args.workers))} gloo processes (ddnb.testing.World), batch {args.batch} "
          f"per rank, median of {args.steps} steps; bucketed: {args.bucket_mb:g} MB buckets, {args.allreduce} "
          f"all-reduce; {_load()}", file=out, flush=True)
    if emulate is not None:
        print(f"{emulate}: every time below is emulated seconds of this profile", file=sys.stderr if args.json
              else sys.stdout, flush=True)
    kwargs = dict(steps=args.steps, warmup=args.warmup, rounds=args.rounds, allreduce=args.allreduce,
                  timeout=args.timeout, log=log)
    if scaling:
        rows = dp_scaling(args.workers, args.models, strategies, args.batch, emulate, args.bucket_mb, **kwargs)
    else:
        rows = dp_benchmark(args.workers[0], args.models, strategies, args.batch, bucket_mb=args.bucket_mb,
                            emulate=emulate, **kwargs)
        if emulate is not None:
            add_model_columns(rows, emulate, batch=args.batch, bucket_mb=args.bucket_mb)
    if emulate is not None:
        for n in args.workers:
            print(f"{n} worker(s): " + next(r["emulation"] for r in rows if r["workers"] == n), file=out)
    print(f"done; {_load()} (other processes on these cores slow every measurement); "
          f"{rows[0]['threads']} intra-op thread(s) per rank", file=out)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(dp_scaling_table(rows) if scaling or emulate is not None else dp_table(rows))
    return 0


# ---------------------------------------------------------------- pipeline (ddnb/bench/pipeline.py)
def _add_pipeline_parser(sub) -> None:
    from ddnb.bench import pipeline

    p = sub.add_parser("pipeline", help="the pipeline bubble per schedule and micro-batch count, against the formula",
                       description=pipeline.__doc__.split("\n\n")[1])
    p.add_argument("--stages", type=_at_least(2, why=" stages (a pipeline of one stage has no bubble)"), default=4,
                   help="pipeline stages = processes (default 4)")
    p.add_argument("--microbatches", type=_ints, default=[1, 2, 4, 8],
                   help="comma list (default 1,2,4,8); a count a schedule cannot take (interleaved: a multiple of "
                        "--stages; dualpipev: at least 2 x --stages) is skipped for it, saying so")
    p.add_argument("--schedules", "--schedule", default="gpipe,1f1b", type=_schedules,
                   help=f"comma list of {', '.join(pipeline.SCHEDULES)} (default gpipe,1f1b)")
    p.add_argument("--chunks", type=_at_least(2), default=2, help="model chunks per rank, interleaved (default 2)")
    p.add_argument("--width", type=_at_least(1), default=2048,
                   help="Linear layers' width (default 2048). (p-1)/(m+p-1) leaves out the activations' messages "
                        "between stages: the narrower the layers, the larger their share (measured on 'ib': "
                        "worst +0.032 at 2048, +0.093 at 1024)")
    p.add_argument("--microbatch-size", type=_at_least(1), default=8, help="rows per micro-batch (default 8)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON (the header goes to stderr)")
    p.add_argument("--timeout", type=_at_least(0.0, float), default=900,
                   help="seconds before a stuck world is killed (default 900)")
    add_emulate_arguments(p)
    p.set_defaults(run=_cmd_pipeline, parser=p)


def _schedules(text: str) -> list[str]:
    from ddnb.bench.pipeline import SCHEDULES

    got = list(dict.fromkeys(a.strip() for a in text.split(",") if a.strip()))
    if not got or any(a not in SCHEDULES for a in got):
        raise argparse.ArgumentTypeError(f"unknown schedule in {text!r}; known: {', '.join(SCHEDULES)}")
    return got


def _cmd_pipeline(parser, args) -> int:
    from ddnb.bench.pipeline import pipeline_benchmark, pipeline_table, runnable

    emulate = emulated(parser, args)
    skipped = {}
    for name in args.schedules:
        for m in args.microbatches:
            why = runnable(name, args.stages, m)
            if why:
                skipped.setdefault((name, why), []).append(m)
    empty = [name for name in args.schedules
             if all(runnable(name, args.stages, m) for m in args.microbatches)]
    if empty:
        parser.error("; ".join(f"{name} can run none of --microbatches {','.join(map(str, args.microbatches))}: "
                               f"{runnable(name, args.stages, args.microbatches[0])}" for name in empty))
    out = sys.stderr if args.json else sys.stdout
    if emulate is not None:
        print(f"{emulate}: the bubble and step time below are measured in emulated time", file=out, flush=True)
    print(f"pipeline of {args.stages} equal stages (2 blocks Linear {args.width} + ReLU per rank, at least one "
          f"per model chunk) on {args.stages} gloo processes, micro-batches of {args.microbatch_size} rows, clocks "
          f"aligned by a barrier before each step; {_load()}", file=out, flush=True)
    for (name, why), ms in skipped.items():
        print(f"{name}: m = {','.join(map(str, ms))} skipped ({why})", file=out, flush=True)
    rows, emulation = pipeline_benchmark(args.stages, args.microbatches, args.schedules, args.chunks, emulate,
                                         args.timeout, width=args.width, microbatch_size=args.microbatch_size)
    if emulation:
        print(emulation, file=out)
    print(json.dumps([{k: v for k, v in r.items() if k != "events"} for r in rows], indent=1) if args.json
          else pipeline_table(rows))
    return 0


# ---------------------------------------------------------------- compress (ddnb/bench/compress.py)
def _add_compress_parser(sub) -> None:
    from ddnb.bench import compress

    p = sub.add_parser("compress", help="gradient compression: bytes per step, step time, final accuracy per method",
                       description=compress.__doc__.split("\n\n")[2])
    p.add_argument("--workers", default=4, help="gloo processes (default 4)",
                   type=_at_least(2, why=" workers (compression over one rank sends nothing)"))
    p.add_argument("--methods", type=_methods, default=list(compress.DEFAULT_METHODS),
                   help=f"comma list of none, fp16, bf16, powersgd:R, topk, sign, horovod:none, horovod:fp16 (default: "
                        f"{','.join(compress.DEFAULT_METHODS)})")
    p.add_argument("--steps", type=_at_least(1), default=150, help="training steps per method (default 150)")
    p.add_argument("--per-rank", type=_at_least(1), default=32, help="samples per rank per step (default 32)")
    p.add_argument("--start", type=_at_least(2), default=10, help="PowerSGD's plain all-reduce steps (default 10)")
    p.add_argument("--ratio", type=_at_least(0.0, float), default=0.01, help="top-k's fraction (default 0.01)")
    p.add_argument("--links", type=_gbps, metavar="GB/S,...",
                   help="instead: time one step of each method beside 'none' on emulated T4s with links of these "
                        "bandwidths (ddnb.bench.compress_links: when compression pays), e.g. 0.1,1,10,100")
    p.add_argument("--json", action="store_true", help="print the rows as JSON (the header goes to stderr)")
    p.add_argument("--timeout", type=_at_least(0.0, float), default=600,
                   help="seconds before a stuck world is killed (default 600)")
    p.set_defaults(run=_cmd_compress, parser=p)


def _gbps(text: str) -> list[float]:
    try:
        got = [float(a) * 1e9 for a in text.split(",") if a.strip()]
    except ValueError:
        got = []
    if not got or min(got) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: need a comma list of positive GB/s, e.g. 0.1,1,10")
    return got


def _methods(text: str) -> list[str]:
    from ddnb.bench.compress import parse_method

    got = list(dict.fromkeys(a.strip() for a in text.split(",") if a.strip()))
    try:
        [parse_method(m) for m in got or [text]]
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return got


def _cmd_compress(parser, args) -> int:
    from ddnb.bench.compress import compress_benchmark, compress_table

    if args.ratio > 1:
        parser.error(f"--ratio {args.ratio}: need a fraction <= 1")
    out = sys.stderr if args.json else sys.stdout
    if args.links:
        from ddnb.bench.compress_links import link_sweep, pays_below

        methods = ["none"] + [m for m in args.methods if m != "none" and not m.startswith("horovod")]
        print(f"one step of each method on {args.workers} emulated T4s (emulated seconds); {_load()}", file=out)
        rows = link_sweep(methods, args.links, args.workers, ratio=args.ratio, timeout=args.timeout)
        print(json.dumps(rows, indent=1) if args.json else "\n".join(
            f"{r['bandwidth'] / 1e9:>7g} GB/s {r['method']:<11} {r['step_time'] * 1e3:9.3f} ms  x{r['speedup']:.2f}"
            for r in rows) + f"\npays up to: {pays_below(rows)}\n{rows[-1]['emulation']}")
        return 0
    print(f"digits MLP 64-256-256-10 on {args.workers} gloo processes (DDP + a ddnb.compression hook), "
          f"{args.steps} steps of {args.per_rank} samples per rank, same seed and data for every method; "
          f"{_load()}", file=out, flush=True)
    rows = compress_benchmark(args.workers, args.methods, args.steps, args.per_rank, start=args.start,
                              ratio=args.ratio, timeout=args.timeout)
    print(json.dumps(rows, indent=1) if args.json else compress_table(rows))
    return 0


def main(argv=None, prog: str = "python -m ddnb.bench") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    return run_without_overruns(args, lambda: args.run(args.parser, args))


if __name__ == "__main__":
    sys.exit(main())
