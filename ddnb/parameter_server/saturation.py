"""The central server's link saturating, on an emulated cluster (`ddnb.emulate`): the BSP
step of one (or k) parameter servers against the same step with a ring all-reduce, as
the number of workers N grows (Li et al. 2014, "Scaling Distributed Machine Learning with
the Parameter Server", OSDI, Sec. 5: servers are sharded because one server's bandwidth
bounds the cluster; Sergeev & Del Balso 2018, "Horovod", Sec. 3: the ring's traffic per
worker does not grow with N).

The flat server of `ddnb.parameter_server.training` receives from any source, which the
emulated message layer cannot pace (`messages.refuse_emulation`). `train_fixed_peers` is
the same BSP arithmetic written with fixed peers, so every message goes through
`ddnb.collectives.p2p` and takes alpha + n/B of its link in emulated time:

    ranks 0..k-1         servers; server j holds shard j (a contiguous 1/k of the S bytes)
    ranks k..k+N-1       workers (worker w = rank - k reads `worker_batch(dataset, w, N, ...)`)
    ranks k+N..          idle (they only join the barriers)

    strategy "server"    server j sends its shard to every worker, in rank order, and
                         receives every worker's gradient shard; then the mean and one SGD step
    strategy "ring"      no server: the workers average with `ring_allreduce` and each
                         applies the same SGD step (as `train_allreduce`)

The model each run is compared with (`model_step_time`), derived from the emulator's
rules (`ddnb.emulate.clock`: a message holds its sender's outgoing and its receiver's
incoming link for tau = alpha + n/B; full duplex). With tau_k = alpha + (S/k)/B, worker i
(1..N) has its k shards at (i - 1 + k) tau_k, computes for c, and its k pushes reach the
servers just as the previous worker's have passed, so the last one lands at

    T_server(N, k) = (N - 1 + 2k) tau_k + c + U_k        grows as N S / (k B): the server's link
    T_ring(N)      = 2(N - 1)(alpha + S/(N B)) + c + U   (Thakur et al. 2005, Sec. 4.5)

with c a worker's compute (loading the parameters into its model, forward, backward,
flattening the gradient), U_k a server's (copying its shard to send, the mean of the N
gradient shards, the SGD step) and U a ring worker's (the N - 1 additions and the division
of its chunk, the SGD step): each is the aten operations that role runs, run once in this
process and charged on the profile's device as the emulator charges them
(`ddnb.bench.parameter_server.charged_compute`, by `ddnb.cost.dp_step.charged_time`). The
emulated times are not computed from these formulas: they come out of the real messages
and waits. The harness that runs every strategy on one World and sets each row beside its
model is `ddnb.bench.parameter_server.server_vs_ring` (`python -m ddnb.bench ps`).
Taught in `notebooks/04_parameter_server.ipynb`.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ddnb._checks import Checks
from ddnb.collectives import p2p
from ddnb.data import Dataset
from ddnb.emulate.clock import warm_up
from ddnb.models import flat_params
from ddnb.parameter_server.messages import message_device
from ddnb.parameter_server.worker import forward_backward, worker_batch
from ddnb.trace import Tracer, get_tracer

STRATEGIES = ("server", "ring")


def _wait(pendings) -> None:
    for p in pendings:
        p.wait()


def train_fixed_peers(model_fn, dataset, workers: int, servers: int = 1, strategy: str = "server", steps: int = 4,
                      batch_size: int = 32, lr: float = 0.05, momentum: float = 0.0, seed: int = 0, loss_fn=None,
                      tracer: Tracer | None = None) -> dict:
    """Call on every rank of a world of at least `servers + workers` ranks (roles above).
    Returns {"rank", "role" ("server"/"worker"/"idle"), "times" (seconds from each step's
    barrier to this rank's end of the step; emulated in an emulated cluster), "losses" (a
    worker's), "params" (a server's shard, or a ring worker's whole copy)}. Every tensor lives
    on `message_device()`: the host on gloo (and "cpu:gloo,cuda:nccl"), this rank's GPU on a
    pure nccl group, where the compute then runs too."""
    from ddnb.collectives import ring_allreduce
    from ddnb.timing import barrier_and_clock

    world_size, rank = dist.get_world_size(), dist.get_rank()
    with Checks("train_fixed_peers") as check:
        check.integer("workers", workers, min=1)
        check.integer("servers", servers, min=1)
        check.choice("strategy", strategy, STRATEGIES)
        check.integer("steps", steps, min=1)
        check.integer("batch_size", batch_size, min=1)
        check.number("lr", lr, positive=True)
        if isinstance(workers, int) and isinstance(servers, int):
            check.rule(servers + workers <= world_size, f"servers={servers} + workers={workers} need "
                       f"{servers + workers} ranks; the world has {world_size}")
    dataset = dataset if isinstance(dataset, Dataset) else Dataset(*dataset)
    loss_fn, tr = loss_fn or F.cross_entropy, get_tracer(tracer)
    server_ranks, worker_ranks = list(range(servers)), list(range(servers, servers + workers))
    group = dist.new_group(ranks=worker_ranks) if strategy == "ring" else None   # every rank takes part
    role = ("server" if rank in server_ranks and strategy == "server" else
            "worker" if rank in worker_ranks else "idle")
    device = message_device()     # the host, or this rank's GPU on a pure nccl group (nccl carries GPU tensors only)
    model = model_fn().to(device)
    params = flat_params(model).clone()                            # (S,), the same start on every rank
    bounds = [(int(c[0]), int(c[-1]) + 1) for c in torch.arange(params.numel()).tensor_split(servers)]
    if role == "server":
        lo, hi = bounds[rank]
        weights = torch.nn.Parameter(params[lo:hi].clone())       # (S/k,)
    elif role == "worker" and strategy == "ring":
        weights = torch.nn.Parameter(params.clone())              # (S,), this worker's copy
    if role != "idle" and not (role == "worker" and strategy == "server"):
        optimizer = torch.optim.SGD([weights], lr=lr, momentum=momentum)
    barrier, clock = barrier_and_clock()
    losses, times = [], []
    for step in range(steps):
        with warm_up(step == 0):      # step 0 is not timed (_median): its overruns are not counted
            barrier()
            start = clock()
            if role == "server":
                grads = [torch.empty_like(weights) for _ in worker_ranks]
                shard = weights.detach().clone()
                _wait(p2p.post([p2p.Op("send", shard, w, name="params") for w in worker_ranks]
                               + [p2p.Op("recv", g, w, name="gradient") for g, w in zip(grads, worker_ranks)], tracer=tr))
                weights.grad = torch.stack(grads).mean(0)              # the mean of the N workers' gradients
                optimizer.step()
            elif role == "worker":
                me = rank - servers
                x, y = (t.to(device) for t in worker_batch(dataset, me, workers, batch_size, step, seed))
                if strategy == "server":
                    _wait(p2p.post([p2p.Op("recv", params[lo:hi], s, name="params")
                                    for s, (lo, hi) in zip(server_ranks, bounds)], tracer=tr))
                    loss, grad = forward_backward(model, params, x, y, loss_fn, tr)
                    _wait(p2p.post([p2p.Op("send", grad[lo:hi], s, name="gradient")
                                    for s, (lo, hi) in zip(server_ranks, bounds)], tracer=tr))
                else:
                    loss, grad = forward_backward(model, weights.detach(), x, y, loss_fn, tr)
                    if workers > 1:
                        ring_allreduce(grad, op="avg", group=group, tracer=tr, check=False)
                    weights.grad = grad
                    optimizer.step()
                losses.append(loss.item())
            times.append(clock() - start)
    out = {"rank": rank, "role": role, "times": times, "losses": losses}
    if role == "server" or (role == "worker" and strategy == "ring"):
        out["params"] = weights.detach().cpu().clone()               # on the host, for the caller
    return out


def model_step_time(strategy: str, workers: int, servers: int, param_bytes: int, alpha: float, bandwidth: float,
                    compute: float, update: float) -> float:
    """Seconds of one BSP step by the model above: T_server(N, k) or T_ring(N). compute: a
    worker's (c); update: a server's (U_k) or a ring worker's (U), as
    `ddnb.bench.parameter_server.charged_compute` charges them."""
    with Checks("model_step_time") as check:
        check.choice("strategy", strategy, STRATEGIES)
        check.integer("workers", workers, min=1)
        check.integer("servers", servers, min=1)
        check.integer("param_bytes", param_bytes, min=1)
        check.number("alpha", alpha, min=0)
        check.number("bandwidth", bandwidth, positive=True)
    n, k, s = workers, servers, param_bytes
    if strategy == "server":
        return (n - 1 + 2 * k) * (alpha + s / k / bandwidth) + compute + update
    ring = 2 * (n - 1) * (alpha + s / n / bandwidth) if n > 1 else 0.0
    return ring + compute + update
