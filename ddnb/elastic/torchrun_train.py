"""Elastic data-parallel training under torchrun: workers leave and join, training goes
on from the last checkpoint with the new world size.

    python -m ddnb.launch elastic --nnodes 1:4 --rdzv-endpoint localhost:29400 \\
        --ckpt-dir /tmp/run --per-rank 8 --every 5        # the same command on each node

builds and runs (`torchrun_command`)

    python -m torch.distributed.run --nnodes 1:4 --nproc-per-node 1 --rdzv-backend c10d \\
        --rdzv-endpoint localhost:29400 --rdzv-id ddnb-elastic --max-restarts 3 \\
        --rdzv-conf last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=5 \\
        -m ddnb.elastic.torchrun_train --ckpt-dir /tmp/run --per-rank 8 --every 5

torchrun's elastic agent (one per node) joins a c10d rendezvous of 1 to 4 nodes. When a
node dies (its heartbeat stops) or a worker fails, or a new node arrives, every agent
stops its workers and starts them again in a new rendezvous round, with new RANK and
WORLD_SIZE (torch.distributed.elastic, "Elastic agent": workers are restarted, not
resized in place). So a worker is written as: on every start, read WORLD_SIZE and RANK,
load the last checkpoint, continue.

The data (the digits, 1,347 training examples) are read in epochs; epoch e visits
order_e = permutation(n, seed, e). The sampler's state is one number, `consumed`: how many
examples of order_e the committed steps have used. A step with N ranks takes the next
global batch order_e[consumed : consumed + N·per_rank] (shorter at the end of the epoch),
rank r its r-th contiguous part (`rank_part`), and sums its examples' losses; the
gradients are all-reduced (sum) and divided by the global batch size, so a step is exactly
one step of SGD on the global batch, whatever N is (Goyal et al. 2017, "Accurate, large
minibatch SGD", Sec. 2: the gradient of the global batch is the average over it).
Because the state is a position in one global order, not "rank r's shard", it survives a
change of N: the new world takes up at `consumed` and splits the rest its own way
(DistributedSampler's rank::N shards would not, their layout depends on N).

Rank 0 writes a checkpoint (model, optimizer, epoch, consumed, step and the list of
committed steps) every `every` steps and at the end, atomically (write, then rename).
A step is *committed* when a checkpoint includes it. The steps a failed world ran after
its last checkpoint are lost with it and run again by the next world, possibly with
another N: their examples were processed twice but only the committed run counts, so over
the committed steps every example of an epoch is used exactly once (the test checks it
from each worker's own log of the indices it trained on). Every worker appends one JSON
line per step to `<ckpt-dir>/log/<gen>-<rank>.jsonl` (gen: a token rank 0 draws at each
start); `replay(history)` trains one process on the committed global batches, which the
elastic run must equal. The checkpoint directory must be visible to every node (a shared
file system); here all nodes are local. Taught in
`notebooks/15_elastic_training.ipynb`.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from datetime import timedelta

import torch

from ddnb._checks import Checks

RDZV_CONF = "last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=5,join_timeout=60"
SIZES = (64, 64, 10)
# Who hosts the c10d store: torchrun's guess ("auto") is every node whose host name is the
# endpoint's; on one machine that is every node, and a second agent's store then also
# listened on the port (seen here: a late agent formed a world of its own). Say it.
_IS_HOST = {"auto": "", "yes": ",is_host=1", "no": ",is_host=0"}
# torch 2.13's agents share one TCP store per round, hosted by round 0's rank 0; when a
# join makes another node rank 0, the old rank 0 kept its own store and both waited 60 s
# for each other's role_info keys (seen here). A fresh store per round avoids that.
AGENT_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


# ------------------------------------------------------------------ the launcher's side
def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `python -m ddnb.launch elastic` (the launcher's, then the script's)."""
    p.add_argument("--nnodes", default="1:4", help="MIN:MAX nodes (or N); the world resizes within them")
    p.add_argument("--nproc-per-node", type=int, default=1)
    p.add_argument("--rdzv-endpoint", default="localhost:29400", help="HOST:PORT of the c10d rendezvous")
    p.add_argument("--rdzv-id", default="ddnb-elastic")
    p.add_argument("--max-restarts", type=int, default=3, help="restarts after failures (joins do not count)")
    p.add_argument("--store-host", choices=("auto", "yes", "no"), default="auto",
                   help="does this node host the rendezvous store (auto: if the endpoint names this host)")
    p.add_argument("--dry-run", action="store_true", help="print the torchrun command instead of running it")
    script_arguments(p)


def script_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ckpt-dir", required=True, help="checkpoint and logs (shared by every node)")
    p.add_argument("--per-rank", type=int, default=8, help="examples per rank per step")
    p.add_argument("--every", type=int, default=5, help="checkpoint every this many steps")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step-delay", type=float, default=0.0, help="seconds of sleep per step (to watch it resize)")
    p.add_argument("--timeout", type=float, default=30, help="seconds any collective may wait")


def parse_nnodes(text) -> tuple:
    """"1:4" -> (1, 4); "2" -> (2, 2); anything else -> (None, None)."""
    parts = str(text).split(":")
    if len(parts) in (1, 2) and all(s.strip().isdigit() for s in parts):
        return int(parts[0]), int(parts[-1])
    return None, None


def check_launch(nnodes, nproc_per_node, rdzv_endpoint, max_restarts, per_rank=1, every=1, epochs=1,
                 lr=0.05) -> None:
    """One ValueError naming every bad argument, before any process starts."""
    with Checks("ddnb.launch elastic") as check:
        lo, hi = parse_nnodes(nnodes)
        if check.rule(lo is not None, f"--nnodes {nnodes!r}: need MIN:MAX or N, e.g. 1:4"):
            check.rule(lo >= 1, f"--nnodes {nnodes}: min nodes {lo} < 1")
            check.rule(lo <= hi, f"--nnodes {nnodes}: min nodes {lo} > max nodes {hi} (rule: 1 <= min <= max)")
        host, _, port = str(rdzv_endpoint).rpartition(":")
        check.rule(bool(host) and port.isdigit() and 1 <= int(port) <= 65535,
                   f"--rdzv-endpoint {rdzv_endpoint!r}: need HOST:PORT with 1 <= PORT <= 65535")
        check.integer("nproc_per_node", nproc_per_node, min=1)
        check.integer("max_restarts", max_restarts, min=0)
        check.positive_ints(per_rank=per_rank, every=every, epochs=epochs)
        check.number("lr", lr, positive=True)


def torchrun_command(args) -> list:
    """The torchrun command line (a list) for the parsed `python -m ddnb.launch elastic` args."""
    script = ["--ckpt-dir", args.ckpt_dir, "--per-rank", str(args.per_rank), "--every", str(args.every),
              "--epochs", str(args.epochs), "--lr", str(args.lr), "--seed", str(args.seed),
              "--step-delay", str(args.step_delay), "--timeout", str(args.timeout)]
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(args.nnodes),
            "--nproc-per-node", str(args.nproc_per_node), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", args.rdzv_endpoint, "--rdzv-id", args.rdzv_id,
            "--max-restarts", str(args.max_restarts), "--rdzv-conf", RDZV_CONF + _IS_HOST[args.store_host],
            "-m", "ddnb.elastic.torchrun_train"] + script


def launch(args) -> int:
    """Check the arguments, then run torchrun (replacing this process) or print its command."""
    try:
        check_launch(args.nnodes, args.nproc_per_node, args.rdzv_endpoint, args.max_restarts,
                     args.per_rank, args.every, args.epochs, args.lr)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    cmd = torchrun_command(args)
    if args.dry_run:
        print(" ".join(cmd))
        return 0
    sys.stdout.flush()
    os.environ.update(AGENT_ENV)
    os.execv(cmd[0], cmd)        # the agent is this process: killing it kills the node


# ------------------------------------------------------------------ the worker's side
def epoch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The order (n,) in which epoch `epoch` visits the examples; the same on every rank:
    `ElasticSampler.order()`'s (06's shard_indices with one replica), as a tensor."""
    from ddnb.data_parallel.sampler import shard_indices

    return torch.tensor(shard_indices(n, 1, 0, epoch, seed))


def rank_part(batch: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank `rank`'s contiguous part of the global batch (B,): sizes differ by at most one."""
    return torch.tensor_split(batch, world_size)[rank]


def _sgd(model, lr: float):
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)


def _step(model, opt, x, y, total: int, group=None) -> float:
    """One SGD step on the global batch of `total` examples, this rank holding (x, y)."""
    import torch.nn.functional as F

    opt.zero_grad()
    loss = F.cross_entropy(model(x), y, reduction="sum")        # sum over the local part (0 if it is empty)
    loss.backward()
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])               # (numel,)
    if group is not False:
        import torch.distributed as dist

        dist.all_reduce(grads, group=group)                                           # sum over ranks
    torch.nn.utils.vector_to_parameters(grads / total, [p.grad for p in model.parameters()])
    opt.step()
    return loss.item()


def replay(history, lr: float = 0.05, seed: int = 0):
    """One process trains on the committed global batches of `history` (the list of
    steps in a checkpoint); returns the model, which the elastic run must equal."""
    from ddnb.data import digits
    from ddnb.models import mlp

    train, _ = digits(seed=0)
    model = mlp(SIZES, seed=seed)
    opt = _sgd(model, lr)
    for h in history:
        idx = epoch_order(len(train), seed, h["epoch"])[h["start"]:h["stop"]]
        _step(model, opt, train.x[idx], train.y[idx], len(idx), group=False)
    return model


def _save(path: str, state: dict) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    torch.save(state, tmp)
    os.replace(tmp, path)                   # atomic: a reader sees the old or the new one


def train_elastic(ckpt_dir: str, per_rank: int = 8, every: int = 5, epochs: int = 1, lr: float = 0.05,
                  seed: int = 0, step_delay: float = 0.0) -> dict:
    """On every rank of the current world: load the last checkpoint (or start), train to
    the end of `epochs`, checkpointing every `every` steps; returns the final state."""
    import torch.distributed as dist

    from ddnb.data import digits
    from ddnb.models import mlp

    rank, n_ranks = dist.get_rank(), dist.get_world_size()
    path = os.path.join(ckpt_dir, "checkpoint.pt")
    box = [None]
    if rank == 0:                            # rank 0 reads, everyone gets the same state
        state = torch.load(path, weights_only=False) if os.path.exists(path) else None
        box = [{"gen": uuid.uuid4().hex[:8], "state": state}]
    dist.broadcast_object_list(box, src=0)
    gen, state = box[0]["gen"], box[0]["state"]
    train, _ = digits(seed=0)
    model = mlp(SIZES, seed=seed)
    opt = _sgd(model, lr)
    if state is None:
        state = {"epoch": 0, "consumed": 0, "step": 0, "history": [], "done": False}
    else:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
    os.makedirs(os.path.join(ckpt_dir, "log"), exist_ok=True)
    log = open(os.path.join(ckpt_dir, "log", f"{gen}-{rank}.jsonl"), "a")
    while not state["done"]:
        e, start = state["epoch"], state["consumed"]
        stop = min(start + n_ranks * per_rank, len(train))
        idx = rank_part(epoch_order(len(train), seed, e)[start:stop], rank, n_ranks)   # (<= per_rank,)
        loss = _step(model, opt, train.x[idx], train.y[idx], stop - start)
        state["step"] += 1
        state["history"].append({"gen": gen, "step": state["step"], "epoch": e, "start": start, "stop": stop,
                                 "world_size": n_ranks})
        state["epoch"], state["consumed"] = (e + 1, 0) if stop == len(train) else (e, stop)
        state["done"] = state["epoch"] == epochs
        log.write(json.dumps({"gen": gen, "step": state["step"], "rank": rank, "world_size": n_ranks, "epoch": e,
                              "indices": idx.tolist(), "loss": loss, "pid": os.getpid(),
                              "time": time.time()}) + "\n")
        log.flush()
        if rank == 0 and (state["step"] % every == 0 or state["done"]):
            _save(path, dict(state, model=model.state_dict(), optimizer=opt.state_dict()))
        time.sleep(step_delay)
    log.close()
    return state


def main(argv=None) -> int:
    """The worker's entry point (`-m ddnb.elastic.torchrun_train`), started by torchrun."""
    import torch.distributed as dist

    from ddnb.runtime.launcher import set_threads

    p = argparse.ArgumentParser(prog="python -m ddnb.elastic.torchrun_train")
    script_arguments(p)
    a = p.parse_args(argv)
    set_threads()
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=a.timeout))
    state = train_elastic(a.ckpt_dir, a.per_rank, a.every, a.epochs, a.lr, a.seed, a.step_delay)
    if dist.get_rank() == 0:
        print(json.dumps({"world_size": dist.get_world_size(), "steps": state["step"],
                          "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))}), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
