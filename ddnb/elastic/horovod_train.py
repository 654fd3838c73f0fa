"""Elastic training with Horovod: `hvd.elastic.run` and `hvd.elastic.TorchState` under
horovodrun, with a host discovery script that adds and removes slots.

    horovodrun -np 2 --min-np 1 --max-np 3 --host-discovery-script ./discover.sh \\
        --network-interface lo --gloo \\
        python -m ddnb.elastic.horovod_train --log-dir /tmp/hvd-run --per-rank 8 --every 5

(`horovodrun_command` builds it, after checking 1 <= min_np <= np <= max_np).

`discover.sh` prints the hosts that may be used now, one `host:slots` a line (here the
lines of a file that can be rewritten while it runs: `discovery_script`; on one machine,
"localhost" and "127.0.0.1" are two hosts to Horovod, both local).
horovodrun's elastic driver runs it every second; when the answer changes it starts
workers on new slots or stops the ones on removed slots, and every worker's
`hvd.elastic.run` loop re-initializes Horovod with the new ranks and size, keeping its
process (Sergeev & Del Balso 2018 describe static Horovod; elastic Horovod is its 0.20
extension, horovod.readthedocs.io "Elastic Horovod").

The state (`TorchState`: model, optimizer, and the sampler's position `consumed`, `epoch`,
`step`, `history`) is copied in memory at every `state.commit()` (every `every` steps):
- a worker fails (HorovodInternalError in a collective): every survivor restores the last
  commit, so the steps after it are lost and done again, as a torchrun restart does from
  its checkpoint (`torchrun_train.py`); the failed worker's host is blacklisted, so with
  a single host Horovod 0.28.1 ends the job instead ("blacklisted slots count == 2 -> stop
  running", seen here): this path needs a second host (127.0.0.1 beside localhost);
- the hosts change (HostsUpdatedInterrupt, raised at the next commit, which has already
  saved the state): nothing is lost;
and then rank 0's state is broadcast to every worker (new ones included: `state.sync()`).
The global batch is the next N·per_rank examples of the epoch's order after `consumed`,
split in contiguous parts (`torchrun_train.rank_part`); gradients are summed over ranks
(op=hvd.Sum) of losses divided by the global batch size, so each step is one SGD step on
the global batch whatever N is. Each worker appends a JSON line per step to
`<log-dir>/hvd-<pid>.jsonl`; rank 0 writes the committed history to `<log-dir>/final.json`
at the end. Taught in `notebooks/15_elastic_training.ipynb`.
"""
from __future__ import annotations

import argparse
import json
import os
import stat
import sys
import time


def discovery_script(path: str, hosts_file: str) -> str:
    """Write an executable discovery script at `path` that prints `hosts_file` at each
    call: its lines, `host:slots` each (rewrite it to add or remove slots); returns path."""
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\ncat {hosts_file}\n")
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def horovodrun_command(np: int, min_np: int, max_np: int, discovery: str, log_dir: str, per_rank: int = 8,
                       every: int = 5, step_delay: float = 0.0, horovodrun: str = "horovodrun") -> list:
    """The horovodrun command line (a list) for this script; one ValueError naming every
    bad count first (rule: 1 <= min_np <= np <= max_np). `--network-interface lo`: on one
    host, horovodrun's elastic mode otherwise waits for a second host to agree on network
    interfaces with (seen here: it waited silently until killed)."""
    from ddnb._checks import Checks

    with Checks("horovodrun_command") as check:
        if check.integer("min_np", min_np, min=1) & check.integer("max_np", max_np, min=1):
            check.rule(min_np <= max_np, f"min_np={min_np} > max_np={max_np} (rule: 1 <= min_np <= np <= max_np)")
            if check.integer("np", np, min=1):
                check.rule(min_np <= np <= max_np, f"np={np} is not in [min_np={min_np}, max_np={max_np}]")
        check.positive_ints(per_rank=per_rank, every=every)
        check.rule(os.access(discovery, os.X_OK), f"discovery={discovery!r}: not an executable file")
    return [horovodrun, "-np", str(np), "--min-np", str(min_np), "--max-np", str(max_np),
            "--host-discovery-script", discovery, "--network-interface", "lo", "--gloo",
            sys.executable, "-m", "ddnb.elastic.horovod_train", "--log-dir", log_dir, "--per-rank", str(per_rank),
            "--every", str(every), "--step-delay", str(step_delay)]


def main(argv=None) -> int:
    import horovod.torch as hvd
    import torch
    import torch.nn.functional as F

    from ddnb.data import digits
    from ddnb.elastic.torchrun_train import SIZES, epoch_order, rank_part
    from ddnb.runtime.launcher import set_threads
    from ddnb.models import mlp

    p = argparse.ArgumentParser(prog="python -m ddnb.elastic.horovod_train")
    p.add_argument("--log-dir", required=True)
    p.add_argument("--per-rank", type=int, default=8)
    p.add_argument("--every", type=int, default=5, help="commit every this many steps")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step-delay", type=float, default=0.0)
    a = p.parse_args(argv)
    set_threads()
    hvd.init()
    train, _ = digits(seed=0)
    model = mlp(SIZES, seed=a.seed)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9),
                                   named_parameters=model.named_parameters(), op=hvd.Sum)
    state = hvd.elastic.TorchState(model=model, optimizer=opt, consumed=0, step=0, history=[])
    log = open(os.path.join(a.log_dir, f"hvd-{os.getpid()}.jsonl"), "a")
    order = epoch_order(len(train), a.seed, 0)                       # (n,) one epoch

    @hvd.elastic.run
    def train_epoch(state):
        while state.consumed < len(train):
            n_ranks, rank = hvd.size(), hvd.rank()
            start = state.consumed
            stop = min(start + n_ranks * a.per_rank, len(train))
            idx = rank_part(order[start:stop], rank, n_ranks)          # (<= per_rank,)
            opt.zero_grad()
            loss = F.cross_entropy(model(train.x[idx]), train.y[idx], reduction="sum") / (stop - start)
            loss.backward()
            opt.step()                                               # sum over ranks = global mean
            state.step += 1
            state.consumed = stop
            # a new list, not append: TorchState's commit keeps a reference to its attributes,
            # not a copy, so an in-place append would survive a restore (seen in the test)
            state.history = state.history + [{"step": state.step, "epoch": 0, "start": start, "stop": stop,
                                              "world_size": n_ranks}]
            log.write(json.dumps({"step": state.step, "rank": rank, "world_size": n_ranks, "start": start,
                                  "indices": idx.tolist(), "pid": os.getpid(), "time": time.time(),
                                  "host": os.environ.get("HOROVOD_HOSTNAME")}) + "\n")
            log.flush()
            if state.step % a.every == 0:
                state.commit()                                       # may raise HostsUpdatedInterrupt
            time.sleep(a.step_delay)
        state.commit()

    train_epoch(state)
    if hvd.rank() == 0:
        with open(os.path.join(a.log_dir, "final.json"), "w") as f:
            json.dump({"history": state.history, "params": [v.tolist() for v in model.state_dict().values()]}, f)
        print(json.dumps({"steps": state.step, "world_size": hvd.size()}), flush=True)
    log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
