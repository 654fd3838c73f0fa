"""A hierarchical parameter server: gradients are summed within each host first, and only
one message per host crosses the network to the server (and one copy of the parameters
comes back per host), the idea of the hierarchical parameter server of Zhao et al. 2020
("Distributed Hierarchical GPU Parameter Server for Massive Scale Deep Learning Ads
Systems", MLSys), and of Horovod's hierarchical all-reduce: the server's link carries H
messages per step instead of N.

    rank 0                     the server (holds the parameters and the optimizer)
    ranks 1..N                 workers; host h holds ranks h*g .. h*g + g - 1 (g = ranks_per_host)
    host leader                the first rank of each host (rank 0 leads host 0)

    each step (BSP)
        down   server -> each other host's leader -> its members        params (S,)
        up     members -> leader: sum of the host's gradients; leaders -> server
        apply  server: mean = sum / N, one SGD step

Bytes per step on the server's link across hosts: 2 (H - 1) S, against 2 (N - m) S for the
flat server of `ddnb.parameter_server.training` (m = the workers on the server's host).
The arithmetic is BSP's: the update is the mean of the N workers' gradients, so the run
equals the flat server and one process on the concatenated batches. Every message goes
through `ddnb.collectives.p2p` with a fixed peer, so unlike the flat server (which receives
from any source) this one runs on an emulated cluster, where intra- and inter-host links
differ (`ddnb.emulate.Profile.ranks_per_host`); there it is timed, grouped by hosts and
flat, by `ddnb.bench.parameter_server.emulated_step_times`.
Taught in `notebooks/05b_decentralized.ipynb`.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ddnb._checks import Checks
from ddnb.collectives import p2p
from ddnb.data import Dataset
from ddnb.models import flat_params
from ddnb.parameter_server.worker import forward_backward, worker_batch
from ddnb.trace import Tracer, get_tracer


def hosts(world_size: int, ranks_per_host: int) -> list[list[int]]:
    """The ranks of each host, rank 0 (the server) first on host 0: [[0, 1, .., g-1], [g, ..], ..]."""
    return [list(range(h, min(h + ranks_per_host, world_size))) for h in range(0, world_size, ranks_per_host)]


def hierarchical_bytes(param_bytes: int, world_size: int, ranks_per_host: int) -> dict:
    """Bytes per step through the server's link across hosts, hierarchical and flat
    (N = world_size - 1 workers, H hosts, S = param_bytes): 2 (H - 1) S and 2 (N - (g - 1)) S;
    and on each intra-host link of a leader, 2 (g - 1) S."""
    with Checks("hierarchical_bytes") as check:
        check.integer("param_bytes", param_bytes, min=1)
        check.integer("world_size", world_size, min=2, why=" (a server and at least one worker)")
        check.integer("ranks_per_host", ranks_per_host, min=1)
    h = len(hosts(world_size, ranks_per_host))
    on_server_host = min(ranks_per_host, world_size) - 1
    return {"hosts": h, "hierarchical": 2 * (h - 1) * param_bytes,
            "flat": 2 * (world_size - 1 - on_server_host) * param_bytes,
            "intra_host": 2 * (min(ranks_per_host, world_size) - 1) * param_bytes}


def _all(pendings) -> None:
    for p in pendings:
        p.wait()


def train_hierarchical(model_fn, dataset, ranks_per_host: int, steps: int, batch_size: int = 32, lr: float = 0.05,
                       momentum: float = 0.0, seed: int = 0, loss_fn=None, tracer: Tracer | None = None) -> dict:
    """Call on every rank (`cluster.run(train_hierarchical, ...)`). Rank 0 serves; ranks
    1..N are workers (worker w = rank - 1 reads `worker_batch(dataset, w, N, ...)`, as the
    flat server's workers do). Returns {"rank", "role" ("server"/"leader"/"member"),
    "losses" (a worker's), "params" (S,) (the server's after the last step), "times"
    (seconds per step, emulated in an emulated cluster)}."""
    from ddnb.timing import barrier_and_clock

    world_size, rank = dist.get_world_size(), dist.get_rank()
    with Checks("train_hierarchical") as check:
        check.rule(world_size >= 2, f"world_size={world_size}: need a server and at least one worker")
        check.integer("ranks_per_host", ranks_per_host, min=1)
        check.integer("steps", steps, min=1)
        check.integer("batch_size", batch_size, min=1)
        check.number("lr", lr, positive=True)
    dataset = dataset if isinstance(dataset, Dataset) else Dataset(*dataset)
    loss_fn, tr = loss_fn or F.cross_entropy, get_tracer(tracer)
    groups = hosts(world_size, ranks_per_host)
    mine = next(g for g in groups if rank in g)
    leader, members = mine[0], mine[1:]
    leaders = [g[0] for g in groups[1:]]
    role = "server" if rank == 0 else "leader" if rank == leader else "member"
    model = model_fn()
    params = flat_params(model).clone()                          # (S,), the same start on every rank
    if rank == 0:
        weights = torch.nn.Parameter(params.clone())
        optimizer = torch.optim.SGD([weights], lr=lr, momentum=momentum)
    barrier, clock = barrier_and_clock()
    losses, times, n = [], [], world_size - 1
    for step in range(steps):
        barrier()
        start = clock()
        # down: the server to every other host's leader, each leader to its members
        if rank == 0:
            params = weights.detach().clone()
            _all(p2p.post([p2p.Op("send", params, dst, name="params") for dst in leaders + members], tracer=tr))
        elif rank == leader:
            p2p.recv(params, 0, tracer=tr, name="params")
            _all(p2p.post([p2p.Op("send", params, dst, name="params") for dst in members], tracer=tr))
        else:
            p2p.recv(params, leader, tracer=tr, name="params")
        # compute: every worker its gradient on its own batch
        grad = torch.zeros_like(params)
        if rank != 0:
            x, y = worker_batch(dataset, rank - 1, n, batch_size, step, seed)
            loss, grad = forward_backward(model, params, x, y, loss_fn, tr)
            losses.append(loss.item())
        # up: members to their leader, which adds its own and sends the host's sum on
        if rank == leader:
            total = grad.clone()
            got = [torch.empty_like(params) for _ in members]
            _all(p2p.post([p2p.Op("recv", g, src, name="gradient") for g, src in zip(got, members)], tracer=tr))
            for g in got:
                total += g
            if rank == 0:
                sums = [torch.empty_like(params) for _ in leaders]
                _all(p2p.post([p2p.Op("recv", s, src, name="host sum") for s, src in zip(sums, leaders)], tracer=tr))
                for s in sums:
                    total += s
                weights.grad = total / n                         # the mean of the N workers' gradients
                optimizer.step()
            else:
                p2p.send(total, 0, tracer=tr, name="host sum")
        else:
            p2p.send(grad, leader, tracer=tr, name="gradient")
        times.append(clock() - start)
    out = {"rank": rank, "role": role, "losses": losses, "times": times}
    if rank == 0:
        out["params"] = weights.detach().clone()
    return out
