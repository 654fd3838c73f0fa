"""The training loop of a parameter-server run (Li et al. 2014, "Scaling Distributed
Machine Learning with the Parameter Server", OSDI): `train` is called on every rank of the
torch.distributed world and plays that rank's role, server (`server.serve`), worker
(`worker.work`) or both (`sharded.train_colocated`), in a process group of the run's own;
servers save their state to `checkpoint_file` and restore from it. `train_on_cluster`
turns the knobs a learner sets (workers, servers, mode, straggler) into a `PSConfig` and
runs `train` on a cluster, returning the plain per-rank dicts that `ddnb.viz` draws.
Taught in `notebooks/04_parameter_server.ipynb`.
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ddnb.data import Dataset
from ddnb.models import flat_params
from ddnb.parameter_server.config import PSConfig
from ddnb.parameter_server.messages import refuse_emulation
from ddnb.parameter_server.server import Server, serve
from ddnb.parameter_server.sharded import shard_parameters, train_colocated
from ddnb.parameter_server.worker import work


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
    stats (listed in the docstring of `ddnb.parameter_server`). `model_fn()` builds the model (the same on every
    rank; the servers' copy gives the initial parameters), `dataset` (x, y) is the
    training set, sharded over the workers; `loss_fn` defaults to cross-entropy. Events
    go to `tracer`, by default each rank's own (gather them with `cluster.run(take_events)`)."""
    world_size, rank = dist.get_world_size(), dist.get_rank()
    config.validate(world_size)
    refuse_emulation()
    dataset = dataset if isinstance(dataset, Dataset) else Dataset(*dataset)
    loss_fn = loss_fn or F.cross_entropy
    k, workers = config.num_servers(world_size), config.worker_ranks(world_size)
    model = model_fn()
    shards = shard_parameters(model, k, config.shard_by)
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
        stats = work(config, model, dataset, loss_fn, shards, group, tracer, t0)
    if config.checkpoint_to and stats.get("state") is not None:
        torch.save(stats["state"], checkpoint_file(config.checkpoint_to, stats["shard"], k))
    stats.update(rank=rank, wall_time=time.time() - t0, config=asdict(config))
    return stats


def train_on_cluster(cluster, model_fn, dataset, workers: int, servers: int = 1, mode: str = "bsp",
                     staleness: int = 0, straggler_delay: float = 0.0, **config) -> list[dict]:
    """Resize `cluster` to servers + workers ranks and run `train` on every rank with
    PSConfig(servers, mode, staleness, straggler_delay, **config), the last worker rank
    being the straggler when straggler_delay > 0. The configuration is validated before
    the cluster is touched. Returns the list of dicts `train` returned, one per rank."""
    config = PSConfig(servers=servers, mode=mode, staleness=staleness,
                      straggler_rank=servers + workers - 1 if straggler_delay else None,
                      straggler_delay=straggler_delay, **config)
    config.validate(servers + workers)
    cluster.resize(servers + workers)
    return cluster.run(train, config, model_fn, dataset)
