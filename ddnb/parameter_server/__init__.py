"""Parameter servers from torch.distributed point-to-point messages (Li et al. 2014,
"Scaling Distributed Machine Learning with the Parameter Server", OSDI).

    from ddnb.parameter_server import PSConfig, train, assemble
    config = PSConfig(servers=1, mode="bsp", steps=200, lr=0.1, momentum=0.9)
    results = cluster.run(train, config, partial(mlp, (64, 128, 10)), train_set)   # one dict per rank
    accuracy(assemble(results, partial(mlp, (64, 128, 10))), test_set)

Roles: ranks 0..k-1 are servers (k = config.servers), ranks k..world_size-1 are workers,
worker number rank - k of N = world_size - k reading shard rank - k of the data. With
`colocated=True` every rank is a worker and the server of shard `rank` (k = N = world_size).

    messages.py     the wire protocol: pull, push, params, done, stop; the Receiver thread
    consistency.py  BSP, SSP(s) and ASP as one rule; the staleness bound
    server.py       Server (parameters, optimizer, version, clocks; checkpoints) and its loop
    worker.py       pull, compute, push
    sharded.py      partition over k servers; co-located servers; bytes per step
    allreduce.py    the same BSP training with an all-reduce instead of a server (the bridge to 05)

`train` returns on a server rank: {"role": "server", "rank", "shard", "bounds" (start, stop),
"mode", "version", "start_version", "updates", "gradients" (pushes received), "dropped",
"pushes" {worker rank: count}, "worker_clocks" {worker rank: clock}, "lost" [{rank, time, silent_s, clock}],
"applied" [{worker, clock, read_version, version, staleness, time}] (one per gradient),
"history" [{time, version, loss}] (one per update), "state" (Server.state_dict()),
"wall_time"}; on a worker rank: {"role": "worker", "rank", "worker", "clocks", "versions"
(per step, the version of each server's parameters used), "losses", "times", "pushes",
"silent", "wall_time"}; co-located ranks return both in one dict (role "colocated"; its
"history" losses are that rank's own batch losses). Every dict also holds "config".
Times are seconds since a barrier that every rank passes before training starts.
Taught in `notebooks/04_parameter_server.ipynb`.
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ddnb.data import Dataset
from ddnb.models import flat_params
from ddnb.parameter_server.allreduce import train_allreduce
from ddnb.parameter_server.consistency import MODES, bound, may_proceed, staleness_bound
from ddnb.parameter_server.messages import ParameterServerError, traffic
from ddnb.parameter_server.server import Server, serve
from ddnb.parameter_server.sharded import (BY, Shard, assemble, bytes_per_step, final_params, partition,
                                           train_colocated)
from ddnb.parameter_server.worker import work, worker_batch

__all__ = ["MODES", "PSConfig", "ParameterServerError", "Server", "Shard", "assemble", "bound", "bytes_per_step",
           "checkpoint_file", "final_params", "may_proceed", "partition", "staleness_bound", "traffic", "train",
           "train_allreduce", "worker_batch"]


FAIL_HOWS = ("silent", "exit")   # PSConfig.fail_how: the worker stops talking, or its process dies


@dataclass(frozen=True)
class PSConfig:
    """One parameter-server run. `validate(world_size)` checks it before anything is sent.

    servers         k server ranks (0..k-1); None: 1, or world_size when colocated
    mode            "bsp" (synchronous), "asp" (asynchronous) or "ssp" (bounded staleness)
    staleness       s of SSP(s): a worker may be s clocks ahead of the slowest (ssp only)
    steps, batch_size, lr, momentum, seed   per worker: steps of SGD on batches of batch_size
    shard_by        "bytes" or "layer" (see `partition`) when there are several servers
    colocated       every rank a worker and the server of one shard (bsp only)
    straggler_rank, straggler_delay   that worker sleeps straggler_delay s every step
    worker_timeout  s of silence after which a worker is lost (also bounds each co-located wait)
    fail_rank, fail_after_steps   that worker fails after that many steps, as `fail_how` says:
    fail_how        "silent" (it stops talking: a hung machine) or "exit" (its process dies for
                    real, mid-step, after pulling: run it with `cluster.run_surviving`)
    checkpoint_to, restore_from   path prefix: servers save their state at the end / start from it
    """
    servers: int | None = None
    mode: str = "bsp"
    staleness: int = 0
    steps: int = 100
    batch_size: int = 32
    lr: float = 0.1
    momentum: float = 0.0
    seed: int = 0
    shard_by: str = "bytes"
    colocated: bool = False
    straggler_rank: int | None = None
    straggler_delay: float = 0.0
    worker_timeout: float = 10.0
    fail_rank: int | None = None
    fail_after_steps: int = 0
    fail_how: str = "silent"
    checkpoint_to: str | None = None
    restore_from: str | None = None

    def num_servers(self, world_size: int) -> int:
        if self.servers is not None:
            return self.servers
        return world_size if self.colocated else 1

    def worker_ranks(self, world_size: int) -> list[int]:
        return list(range(world_size)) if self.colocated else list(range(self.num_servers(world_size), world_size))

    def validate(self, world_size: int) -> "PSConfig":
        """Raise ValueError listing every rule broken (with the values), else return self."""
        n, k, bad = world_size, self.num_servers(world_size), []
        is_int = lambda v: isinstance(v, int) and not isinstance(v, bool)  # noqa: E731
        if self.mode not in MODES:
            bad.append(f"mode={self.mode!r} is not one of {MODES}")
        if not is_int(k) or k < 1:
            bad.append(f"servers={k!r}: need an integer >= 1")
        elif self.colocated and k != n:
            bad.append(f"colocated=True makes every rank a server (servers=world_size={n}), got servers={k}")
        elif k > n:
            bad.append(f"servers={k} > world_size={n}: more servers than ranks")
        elif not self.colocated and n - k < 1:
            bad.append(f"servers={k} of world_size={n} leaves no worker (ranks 0..{k - 1} are servers, workers "
                       f"are ranks {k}..{n - 1}): need servers <= world_size - 1 = {n - 1}, or colocated=True")
        if self.colocated and self.mode != "bsp":
            bad.append(f"colocated=True needs mode='bsp', got mode={self.mode!r}: each step of the co-located "
                       f"exchange is a lock-step all-gather and reduce-scatter; serving a shard while computing "
                       f"(asp/ssp) would need a server thread on every rank")
        if not is_int(self.staleness) or self.staleness < 0:
            bad.append(f"staleness={self.staleness!r}: need an integer >= 0")
        elif self.staleness and self.mode != "ssp":
            bad.append(f"staleness={self.staleness} is only used by mode='ssp', got mode={self.mode!r}")
        for name in ("steps", "batch_size"):
            if not is_int(getattr(self, name)) or getattr(self, name) < 1:
                bad.append(f"{name}={getattr(self, name)!r}: need an integer >= 1")
        if not (isinstance(self.lr, (int, float)) and self.lr > 0):
            bad.append(f"lr={self.lr!r}: need a number > 0")
        if not (isinstance(self.momentum, (int, float)) and 0 <= self.momentum < 1):
            bad.append(f"momentum={self.momentum!r}: need 0 <= momentum < 1")
        if self.shard_by not in BY:
            bad.append(f"shard_by={self.shard_by!r} is not one of {BY}")
        if not (isinstance(self.worker_timeout, (int, float)) and self.worker_timeout > 0):
            bad.append(f"worker_timeout={self.worker_timeout!r}: need a number of seconds > 0")
        workers = self.worker_ranks(n) if is_int(k) and 1 <= k <= n else []
        for name in ("straggler_rank", "fail_rank"):
            r = getattr(self, name)
            if r is not None and r not in workers:
                bad.append(f"{name}={r!r} is not a worker rank (workers: {workers})")
        if not (isinstance(self.straggler_delay, (int, float)) and self.straggler_delay >= 0):
            bad.append(f"straggler_delay={self.straggler_delay!r}: need a number of seconds >= 0")
        elif isinstance(self.worker_timeout, (int, float)) and self.straggler_delay >= self.worker_timeout:
            bad.append(f"straggler_delay={self.straggler_delay} >= worker_timeout={self.worker_timeout}: the "
                       f"straggler would be declared lost; make worker_timeout larger")
        if self.fail_how not in FAIL_HOWS:
            bad.append(f"fail_how={self.fail_how!r} is not one of {FAIL_HOWS}")
        elif self.fail_how == "exit" and self.colocated:
            bad.append("fail_how='exit' with colocated=True: a co-located rank is also a server; its death "
                       "takes its shard with it, so nothing can go on")
        if not is_int(self.fail_after_steps) or not (0 <= self.fail_after_steps < max(self.steps, 1)):
            bad.append(f"fail_after_steps={self.fail_after_steps!r}: need 0 <= fail_after_steps < steps={self.steps}")
        if bad:
            raise ValueError(f"invalid PSConfig for world_size={n}: " + "; ".join(bad))
        return self


def session_timeout(config: PSConfig) -> float:
    """Seconds any single wait may take in a run's own process group. A run gets a group of
    its own, so that its receives cannot take messages of another run. Every wait in it
    ends within about worker_timeout (a worker waits at most one step of the slowest one,
    a server hears from each worker at least every worker_timeout or declares it lost),
    so twice that plus a margin only ends waits that nothing will answer: the receiver
    thread of a server whose worker died, which thus exits soon after its run."""
    return 2 * config.worker_timeout + 10.0


def checkpoint_file(prefix: str, shard: int, servers: int) -> str:
    """Where server `shard` of `servers` saves its state: "{prefix}.shard{j}of{k}.pt"."""
    return f"{prefix}.shard{shard}of{servers}.pt"


def _load_checkpoints(config, k: int, shards, workers) -> list[dict]:
    """Every shard's saved state, checked against this run (on every rank, before any message)."""
    states = []
    for j, sh in enumerate(shards):
        path = checkpoint_file(config.restore_from, j, k)
        if not os.path.exists(path):
            raise ValueError(f"restore_from={config.restore_from!r}: no checkpoint {path!r} for shard {j} of "
                             f"servers={k} (was it saved with the same number of servers?)")
        st = torch.load(path, weights_only=True)
        if tuple(st["bounds"]) != (sh.start, sh.stop) or sorted(st["clocks"]) != list(workers):
            raise ValueError(f"checkpoint {path!r} holds elements {tuple(st['bounds'])} for workers "
                             f"{sorted(st['clocks'])}; this run's shard {j} is {(sh.start, sh.stop)} for workers "
                             f"{list(workers)}: restore with the same servers, shard_by, colocated and world size")
        states.append(st)
    return states


def train(config: PSConfig, model_fn, dataset, loss_fn=None, tracer=None) -> dict:
    """Call on every rank of the torch.distributed world (e.g. `cluster.run(train, ...)`):
    plays this rank's role (server or worker, or both when co-located) and returns its
    stats (see the module docstring). `model_fn()` builds the model (the same on every
    rank; the servers' copy gives the initial parameters), `dataset` (x, y) is the
    training set, sharded over the workers; `loss_fn` defaults to cross-entropy. Events
    go to `tracer`, by default each rank's own (gather them with `cluster.run(take_events)`)."""
    world_size, rank = dist.get_world_size(), dist.get_rank()
    config.validate(world_size)
    dataset = dataset if isinstance(dataset, Dataset) else Dataset(*dataset)
    loss_fn = loss_fn or F.cross_entropy
    k, workers = config.num_servers(world_size), config.worker_ranks(world_size)
    model = model_fn()
    shards = partition(model, k, config.shard_by)
    smallest = len(dataset) // len(workers)
    if config.batch_size > smallest:
        raise ValueError(f"batch_size={config.batch_size} > {smallest} examples in the smallest worker shard "
                         f"({len(dataset)} examples over {len(workers)} workers)")
    states = _load_checkpoints(config, k, shards, workers) if config.restore_from else [None] * k
    server = None
    if rank < k:                            # built (and restored) before anything is sent
        sh = shards[rank]
        server = Server(flat_params(model)[sh.start:sh.stop], workers, config.lr, config.momentum,
                        shard=rank, bounds=(sh.start, sh.stop))
        if states[rank] is not None:
            server.load_state_dict(states[rank])
    group = dist.new_group(ranks=list(range(world_size)), timeout=timedelta(seconds=session_timeout(config)))
    dist.barrier(group=group)
    t0 = time.time()
    if config.colocated:
        stats = train_colocated(config, model, dataset, loss_fn, shards, server, group, tracer, t0)
    elif server is not None:
        stats = serve(server, config.mode, config.staleness, config.worker_timeout, group, tracer, t0)
    else:
        silent = config.fail_after_steps if config.fail_rank == rank else None
        delay = config.straggler_delay if config.straggler_rank == rank else 0.0
        stats = work(model, dataset, loss_fn, list(range(k)), [(s.start, s.stop) for s in shards],
                     rank - k, len(workers), config.steps, config.batch_size, config.seed, group, tracer, t0,
                     delay=delay, silent_after=silent, die=config.fail_how == "exit")
    if config.checkpoint_to and stats.get("state") is not None:
        torch.save(stats["state"], checkpoint_file(config.checkpoint_to, stats["shard"], k))
    stats.update(rank=rank, wall_time=time.time() - t0, config=asdict(config))
    return stats
