"""The training chapters as scripts, for launchers that start one process per rank
themselves, on one machine or several:

    torchrun --nproc-per-node 2 -m ddnb.launch dp --strategy ddp --steps 50
    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 4 --rdzv-endpoint host1:29500 \\
        -m ddnb.launch dp --strategy bucketed              # and --node-rank 1 on host2
    horovodrun -np 2 -H localhost:2 --gloo python -m ddnb.launch dp --strategy horovod
    horovodrun -np 8 -H host1:4,host2:4 python -m ddnb.launch dp --strategy horovod
    python -m ddnb.launch elastic --nnodes 1:4 --rdzv-endpoint host1:29400 --ckpt-dir /shared/run

The same `ddnb.data_parallel.train.train_digits` the notebooks run on a `ddnb.Cluster`
(notebooks 06 and 07), so a result seen in a notebook can be reproduced at scale. The
process group comes from the launcher's environment: torchrun's RANK / WORLD_SIZE /
MASTER_ADDR / MASTER_PORT (`init_method="env://"`; "cpu:gloo,cuda:nccl" with
cuda:LOCAL_RANK when every local rank has a GPU, so CPU and CUDA tensors both work, else
gloo), horovodrun's HOROVOD_RANK / HOROVOD_SIZE (`hvd.init()`).
Each rank uses cores / local ranks intra-op threads (`ddnb.runtime.worker.threads_for`; e.g.
`DDNB_THREADS=1 horovodrun ...` overrides), which rank 0's JSON line reports as "threads".
Rank 0 prints one JSON line; `--compare` also trains the single-process reference on the
global batch and prints the largest parameter difference. Arguments are checked before
any process group is formed.
Taught in `notebooks/07_horovod.ipynb`.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import timedelta

from ddnb.runtime.launcher import (LOCAL_SIZE_VARS, launcher_backend, launcher_env, local_ranks,  # noqa: F401
                                   set_threads)


def _parser() -> argparse.ArgumentParser:
    from ddnb.data_parallel.train import STRATEGIES

    ap = argparse.ArgumentParser(prog="python -m ddnb.launch", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="chapter", required=True)
    dp = sub.add_parser("dp", help="data-parallel training on the digits (notebooks 06 and 07)")
    dp.add_argument("--strategy", choices=STRATEGIES, default="ddp")
    dp.add_argument("--steps", type=int, default=50)
    dp.add_argument("--per-rank", type=int, default=32, help="digits per rank per step")
    dp.add_argument("--lr", type=float, default=0.05)
    dp.add_argument("--hidden", type=int, default=128, help="units per hidden layer")
    dp.add_argument("--layers", type=int, default=1, help="hidden layers (more: more, smaller tensors)")
    dp.add_argument("--seed", type=int, default=0)
    dp.add_argument("--allreduce", default="torch", help="naive/bucketed: torch, ring, tree, naive, halving_doubling")
    dp.add_argument("--bucket-mb", type=float, default=0.01)
    dp.add_argument("--timeout", type=float, default=120, help="seconds any collective may wait")
    dp.add_argument("--compare", action="store_true", help="rank 0 also trains the single-process reference")
    from ddnb.elastic.torchrun_train import add_arguments

    add_arguments(sub.add_parser("elastic", help="elastic training under torchrun: nodes leave and join "
                                                 "(ddnb/elastic/torchrun_train.py)"))
    return ap


def init_from_launcher(strategy: str, timeout: float) -> None:
    """Form the world the strategy needs from the launcher's environment, or say why not."""
    launcher = launcher_env()
    if strategy == "horovod":
        if launcher != "horovodrun":
            raise SystemExit("ddnb.launch: --strategy horovod runs under horovodrun "
                             "(horovodrun -np 2 -H localhost:2 --gloo python -m ddnb.launch dp --strategy horovod)")
        set_threads()
        import horovod.torch as hvd

        hvd.init()
        return
    if launcher != "torchrun":
        raise SystemExit(f"ddnb.launch: --strategy {strategy} runs under torchrun (RANK, WORLD_SIZE, MASTER_ADDR and "
                         f"MASTER_PORT not all set): torchrun --nproc-per-node 2 -m ddnb.launch dp --strategy {strategy}")
    import torch
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_size = local_ranks()
    set_threads()
    backend = launcher_backend(torch.cuda.device_count() if torch.cuda.is_available() else 0, local_size)
    if backend != "gloo":
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend, init_method="env://", timeout=timedelta(seconds=timeout))


def main(argv=None) -> int:
    import torch

    from ddnb.data_parallel.train import check_args, reference_digits, train_digits

    args = _parser().parse_args(argv)
    if args.chapter == "elastic":
        from ddnb.elastic.torchrun_train import launch

        return launch(args)
    try:
        check_args(args.strategy, args.steps, args.per_rank, args.lr, args.hidden, args.layers)
    except ValueError as e:
        raise SystemExit(f"ddnb.launch: {e}") from None
    init_from_launcher(args.strategy, args.timeout)
    out = train_digits(args.strategy, steps=args.steps, per_rank=args.per_rank, lr=args.lr, seed=args.seed,
                       hidden=args.hidden, layers=args.layers,
                       allreduce=args.allreduce, bucket_mb=args.bucket_mb)
    if out["rank"] == 0:
        row = {"strategy": args.strategy, "world_size": out["world_size"], "steps": args.steps,
               "tensors": 2 * (args.layers + 1),
               "first_loss": round(out["losses"][0], 6), "final_loss": round(out["losses"][-1], 6),
               "accuracy": round(out["accuracy"], 6), "step_time": out["step_time"],
               "threads": torch.get_num_threads()}
        if args.compare:
            ref = reference_digits(out["world_size"], steps=args.steps, per_rank=args.per_rank, lr=args.lr,
                                   hidden=args.hidden, layers=args.layers, seed=args.seed)
            row["max_param_diff_vs_single_process"] = (out["params"] - ref["params"]).abs().max().item()
        print(json.dumps(row), flush=True)
    # Every rank leaves together: a rank that tears its connections down while rank 0 is
    # still training the reference can abort the launch (gloo on a closed socket).
    if args.strategy == "horovod":
        import horovod.torch as hvd

        hvd.join()
        hvd.shutdown()
    else:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
