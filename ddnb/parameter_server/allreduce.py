"""The same synchronous training with no server: the workers average their gradients with
an all-reduce (ddnb.collectives, notebook 05) and each applies the same SGD step to its own
copy of the parameters. This is where parameter servers gave way to all-reduce in deep
learning (Sergeev & Del Balso 2018, "Horovod: fast and easy distributed deep learning in
TensorFlow", Sec. 3; Patarasuk & Yuan 2009 for the ring).

It is BSP with one server, step for step: the same workers (ranks k..world_size-1 of a
`PSConfig` with k servers; the server ranks sit idle), the same batches (`worker_batch`),
the average of the same N gradients, the same SGD with momentum, so the parameters agree
to rounding. Only the traffic differs. Per step, with S bytes of parameters:

    central server (BSP)    the server's link carries N·S in and N·S out: 2·N·S
    ring all-reduce         every worker sends and receives 2(N-1)/N·S: under 4·S whatever N is

Taught in `notebooks/04_parameter_server.ipynb` (the bridge to 05).
"""
from __future__ import annotations

import time
from dataclasses import asdict

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ddnb._checks import Checks
from ddnb.data import Dataset
from ddnb.models import flat_params
from ddnb.parameter_server.worker import forward_backward, worker_batch
from ddnb.trace import Tracer, get_tracer


def train_allreduce(config, model_fn, dataset, loss_fn=None, tracer: Tracer | None = None,
                    algorithm: str = "ring") -> dict:
    """Call on every rank (e.g. `cluster.run(train_allreduce, config, ...)`). The workers
    of `config` (a `PSConfig` with mode "bsp", not co-located) train `config.steps` steps,
    averaging gradients with `ddnb.collectives.<algorithm>_allreduce` in a group of the
    workers only. Returns on a worker {"role": "allreduce", "rank", "worker", "losses",
    "times", "params" (S,), "wall_time", "config"}; on a server rank {"role": "idle", ...}."""
    from ddnb.collectives import ALLREDUCES

    world_size, rank = dist.get_world_size(), dist.get_rank()
    config.validate(world_size)
    with Checks("train_allreduce") as check:
        check.rule(config.mode == "bsp" and not config.colocated, f"an all-reduce is synchronous and has no "
                   f"servers: need mode='bsp' and colocated=False, got mode={config.mode!r}, "
                   f"colocated={config.colocated}")
        check.choice("algorithm", algorithm, ALLREDUCES)
    dataset = dataset if isinstance(dataset, Dataset) else Dataset(*dataset)
    loss_fn = loss_fn or F.cross_entropy
    workers = config.worker_ranks(world_size)
    group = dist.new_group(ranks=list(workers))                 # every rank takes part in new_group
    stats = {"rank": rank, "config": asdict(config)}
    if rank not in workers:
        stats.update(role="idle", wall_time=0.0)
        return stats
    model = model_fn()
    params = torch.nn.Parameter(flat_params(model).clone())    # (S,), this worker's copy
    optimizer = torch.optim.SGD([params], lr=config.lr, momentum=config.momentum)
    allreduce, tr, worker = ALLREDUCES[algorithm], get_tracer(tracer), rank - workers[0]
    stats.update(role="allreduce", worker=worker, losses=[], times=[])
    dist.barrier(group=group)
    t0 = time.time()
    for step in range(config.steps):
        x, y = worker_batch(dataset, worker, len(workers), config.batch_size, step, config.seed)  # (B, ...), (B,)
        loss, grad = forward_backward(model, params.detach(), x, y, loss_fn, tracer)              # (), (S,)
        # the N gradients' mean on every worker; check=False: every worker passes the same (S,) by construction
        allreduce(grad, op="avg", group=group, tracer=tracer, check=False)
        with tr.span("compute", "optimizer"):
            params.grad = grad
            optimizer.step()
        stats["losses"].append(loss.item())
        stats["times"].append(time.time() - t0)
    stats.update(params=params.detach().clone(), wall_time=time.time() - t0)
    return stats
