"""Parameter servers from torch.distributed point-to-point messages (Li et al. 2014,
"Scaling Distributed Machine Learning with the Parameter Server", OSDI).

    from ddnb.parameter_server import PSConfig, train, assemble
    config = PSConfig(servers=1, mode="bsp", steps=200, lr=0.1, momentum=0.9)
    results = cluster.run(train, config, partial(mlp, (64, 128, 10)), train_set)   # one dict per rank
    accuracy(assemble(results, partial(mlp, (64, 128, 10))), test_set)

Roles: ranks 0..k-1 are servers (k = config.servers), ranks k..world_size-1 are workers,
worker number rank - k of N = world_size - k reading shard rank - k of the data. With
`colocated=True` every rank is a worker and the server of shard `rank` (k = N = world_size).

    config.py       PSConfig: servers, mode, steps, sharding, faults; validate lists every broken rule
    training.py     train (every rank plays its role), checkpoint_file, train_on_cluster
    messages.py     the wire protocol: pull, push, params, done, stop; the Receiver thread
    consistency.py  BSP, SSP(s) and ASP as one rule; the staleness bound
    server.py       Server (parameters, optimizer, version, clocks; checkpoints) and its loop
    worker.py       pull, compute (forward_backward, shared with the two below), push
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
from ddnb.parameter_server.allreduce import train_allreduce
from ddnb.parameter_server.config import FAIL_HOWS, PSConfig
from ddnb.parameter_server.consistency import MODES, bound, may_proceed, staleness_bound
from ddnb.parameter_server.messages import ParameterServerError, traffic
from ddnb.parameter_server.server import Server, serve
from ddnb.parameter_server.sharded import (BY, Shard, assemble, bytes_per_step, final_params, shard_parameters,
                                           train_colocated)
from ddnb.parameter_server.training import checkpoint_file, session_timeout, train, train_on_cluster
from ddnb.parameter_server.worker import work, worker_batch

__all__ = ["MODES", "PSConfig", "ParameterServerError", "Server", "Shard", "assemble", "bound", "bytes_per_step",
           "checkpoint_file", "final_params", "may_proceed", "shard_parameters", "staleness_bound", "traffic", "train",
           "train_allreduce", "train_on_cluster", "worker_batch"]
