"""`python -m ddnb.bench plan`: the layout planner (`ddnb.cost.planner`) from the command
line, and its check against a published table. Nothing runs but the formulas: no process
starts, the times are predictions.

    python -m ddnb.bench plan --paper megatron2021 --json      # Table 1 of Narayanan et al. 2021
    python -m ddnb.bench plan --model 48,8192,64,51200,2048 --profile ib --workers 64 \\
        --memory 80GB --batch 512 --top 5                      # the fastest layouts that fit
    python -m ddnb.bench plan --workers 16 --emulate ib --json # the ranking, run and refuted

--paper megatron2021 prints `ddnb.cost.megatron2021.megatron2021_rows()`: each row of the
paper's Table 1, its achieved TFLOP/s per GPU and the model's, and the error. --emulate
PROFILE runs the planner's top layouts (--top, default 8) and --low more that it ranks low
(default 4) of a small GPT on an emulated cluster of --workers processes and prints each
measured step beside its prediction, with the rank correlation
(`ddnb.bench.plan_check`; --json: {"rows": [{layout, predicted_step, measured_step, error,
predicted_rank, measured_rank}, ...], "summary": {spearman, ...}}). Taught in
`notebooks/16_capstone.ipynb`.
"""
from __future__ import annotations

import argparse
import json

from ddnb.bench.args import _at_least, _ints, add_emulate_arguments, emulated

PAPERS = ("megatron2021",)


def _model(text: str) -> dict:
    try:
        values = [int(a) for a in text.split(",")]
    except ValueError:
        values = []
    if len(values) != 5 or min(values) < 1:
        raise argparse.ArgumentTypeError(f"need LAYERS,D_MODEL,HEADS,VOCAB,SEQ_LEN (5 integers >= 1), got {text!r}")
    return dict(zip(("n_layers", "d_model", "n_heads", "vocab_size", "seq_len"), values))


def _bytes(text: str) -> float:
    units = {"GB": 1e9, "MB": 1e6, "TB": 1e12, "B": 1}
    for unit, scale in units.items():
        if text.upper().endswith(unit):
            try:
                x = float(text[:-len(unit)]) * scale
            except ValueError:
                break
            if x > 0:
                return x
            break
    raise argparse.ArgumentTypeError(f"need a size such as 80GB or 512MB (decimal units), got {text!r}")


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help="rank every dp x pp x tp x cp layout of a GPT by predicted step time, or "
                                    "check the model against a paper (--paper megatron2021)",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--paper", choices=PAPERS, help="print the model against this paper's table instead")
    p.add_argument("--model", type=_model, metavar="L,D,HEADS,VOCAB,SEQ", help="the GPT's shape")
    p.add_argument("--profile", default="ib", help="a ddnb.emulate profile name (default ib)")
    p.add_argument("--workers", type=_at_least(1), help="workers (GPUs)")
    p.add_argument("--memory", type=_bytes, help="memory per worker, e.g. 80GB")
    p.add_argument("--batch", type=_at_least(1), help="global batch, sequences per step")
    p.add_argument("--microbatch-sizes", type=_ints, default=[1, 2, 4, 8], help="comma list (default 1,2,4,8)")
    p.add_argument("--top", type=_at_least(1), help="layouts to print (default 10; --json: all); with --emulate, "
                                                    "the planner's fastest layouts to run (default 8)")
    p.add_argument("--low", type=_at_least(0), default=4, help="with --emulate: layouts the planner ranks low "
                                                               "(its third quarter) to run too (default 4)")
    p.add_argument("--steps", type=_at_least(2), default=2, help="with --emulate: steps per layout, the last "
                                                                 "one measured (default 2)")
    p.add_argument("--allreduce", choices=("hierarchical", "ring"),
                   help="how the model prices data-parallel collectives across hosts: NCCL's two levels "
                        "(default without --emulate) or one flat ring, what the emulated cluster runs "
                        "(default with --emulate)")
    add_emulate_arguments(p)
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.set_defaults(run=run, parser=p)


def run(parser, args) -> int:
    if args.emulate is not None:
        return _run_emulated(parser, args)
    if args.slowdown is not None:
        parser.error("--slowdown needs --emulate")
    if args.paper:
        from ddnb.cost.megatron2021 import megatron2021_rows

        rows = megatron2021_rows()
        if args.json:
            print(json.dumps(rows, indent=1))
        else:
            print(f"{'model':>8} {'t':>2} {'p':>3} {'d':>3} {'GPUs':>5} {'paper':>6} {'model':>6} {'error':>7}")
            for r in rows:
                print(f"{r['model']:>8} {r['tensor']:>2} {r['pipeline']:>3} {r['data']:>3} {r['gpus']:>5} "
                      f"{r['paper_tflops']:>6} {r['predicted_tflops']:>6.1f} {r['error']:>+7.1%}")
        return 0
    missing = [f"--{n}" for n in ("model", "workers", "memory", "batch") if getattr(args, n) is None]
    if missing:
        parser.error(f"without --paper, plan needs {', '.join(missing)}")
    from ddnb.cost.planner import plan, plan_table

    try:
        rows = plan(args.model, args.profile, args.workers, args.memory, args.batch,
                    microbatch_sizes=tuple(args.microbatch_sizes), allreduce=args.allreduce or "hierarchical")
    except ValueError as e:
        parser.error(str(e))
    print(json.dumps(rows, indent=1) if args.json else plan_table(rows, top=args.top or 10))
    return 0


def _run_emulated(parser, args) -> int:
    """--emulate: the planner's ranking of the small GPT, run on the emulated cluster."""
    unused = [f"--{n}" for n in ("paper", "model", "memory", "batch") if getattr(args, n) is not None]
    if unused:
        parser.error(f"--emulate runs ddnb.bench.plan_check's small GPT (batch 16): drop {', '.join(unused)}")
    if args.workers is None or args.workers < 2:
        parser.error("--emulate needs --workers N (N >= 2)")
    from ddnb.bench.plan_check import plan_check, plan_check_table

    profile = emulated(parser, args, args.workers)
    rows, summary = plan_check(args.workers, profile, top=args.top or 8, low=args.low, steps=args.steps,
                               allreduce=args.allreduce or "ring")
    if args.json:
        print(json.dumps({"rows": rows, "summary": summary}, indent=1))
    else:
        print(plan_check_table(rows, summary))
        print(summary["emulation"])
    return 0
