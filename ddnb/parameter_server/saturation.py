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
(`ddnb.cost.dp_step.charged_time`). The emulated times are not computed from these
formulas: they come out of the real messages and waits.
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
    worker's (c); update: a server's (U_k) or a ring worker's (U), as `charged_compute`."""
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


def charged_compute(profile, model_fn, dataset, batch_size: int = 32, lr: float = 0.05) -> dict:
    """The model's compute, from the operations each role runs (above), on `profile`'s
    device: {"compute": c, "server_update": fn(N, k) -> U_k, "ring_update": fn(N) -> U}."""
    from ddnb.cost.dp_step import charged_time

    dataset = dataset if isinstance(dataset, Dataset) else Dataset(*dataset)
    model = model_fn()
    params = flat_params(model).clone()                            # (S,)
    x, y = worker_batch(dataset, 0, 1, batch_size, 0, 0)
    compute = charged_time(lambda: forward_backward(model, params, x, y, F.cross_entropy), profile)

    def sgd_step(n: int) -> float:
        w = torch.nn.Parameter(torch.zeros(n))
        opt = torch.optim.SGD([w], lr=lr)
        w.grad = torch.zeros(n)
        return charged_time(opt.step, profile)

    def server_update(workers: int, servers: int) -> float:
        shard = params[:-(-params.numel() // servers)]                  # (S/k,), the largest shard
        grads = [torch.zeros_like(shard) for _ in range(workers)]
        return (charged_time(lambda: (shard.detach().clone(), torch.stack(grads).mean(0)), profile)
                + sgd_step(shard.numel()))

    def ring_update(workers: int) -> float:
        if workers == 1:
            return sgd_step(params.numel())
        chunk = torch.zeros(-(-params.numel() // workers))              # (S/N,)
        adds = charged_time(lambda: chunk.add_(chunk), profile)
        return (workers - 1) * adds + charged_time(lambda: chunk.div_(workers), profile) + sgd_step(params.numel())

    return {"compute": compute, "server_update": server_update, "ring_update": ring_update}


def _median(ts):
    later = sorted(ts[1:]) or list(ts)         # the first step pays one-time costs
    return later[len(later) // 2]


def server_vs_ring(profile, model_fn, dataset, workers=(1, 2, 4, 8), servers=(1, 2), steps: int = 4,
                   batch_size: int = 32, lr: float = 0.05, timeout: float = 300) -> dict:
    """Run `train_fixed_peers` on one World of max(servers) + max(workers) ranks, for every
    worker count: with each number of servers in `servers`, and with the ring. `profile`:
    an emulated cluster (a name in `ddnb.emulate.PROFILES`, whose slowdown then grows with
    the ranks, or a Profile), or None for real mode (this machine's processes and clock).
    Returns {"rows": [{strategy, servers (0 for the ring), workers, step_time (seconds,
    emulated or real: the median after the first step of the slowest rank's), and when
    emulated update (U_k or U), model_step_time, error (run / model - 1)}], "same_params": the last server
    run's shards joined equal the ring's parameters (1e-6), "param_bytes", "emulation":
    the overrun summary, "profile": the cluster in words, and when emulated "compute" (c,
    the model's seconds of a worker's compute)}."""
    from ddnb.emulate import get_profile, summary
    from ddnb.testing import World

    with Checks("server_vs_ring") as check:
        check.integers("workers", workers, min=1, count=1)
        check.integers("servers", servers, min=1, count=1)
        check.integer("steps", steps, min=2, why=" (the first step is not counted)")
    emulated = get_profile(profile) if profile is not None else None   # a bad name fails before any process
    dataset = dataset if isinstance(dataset, Dataset) else Dataset(*dataset)
    model = model_fn()
    param_bytes = flat_params(model).numel() * 4
    if emulated is not None:
        charged = charged_compute(emulated, model_fn, dataset, batch_size, lr)
    rows, last = [], {}
    with World(max(servers) + max(workers), emulate=profile, timeout=timeout) as world:
        for n in workers:
            for strategy, k in [("server", k) for k in servers] + [("ring", 1)]:
                out = world.run(train_fixed_peers, model_fn, dataset, n, k, strategy, steps, batch_size, lr)
                t = _median([max(r["times"][i] for r in out) for i in range(steps)])
                row = {"strategy": strategy, "servers": k if strategy == "server" else 0, "workers": n,
                       "step_time": t}
                if emulated is not None:
                    link = emulated.inter
                    row["update"] = (charged["server_update"](n, k) if strategy == "server" else
                                     charged["ring_update"](n))
                    row["model_step_time"] = model_step_time(strategy, n, k, param_bytes, link.alpha,
                                                             link.bandwidth, charged["compute"], row["update"])
                    row["error"] = t / row["model_step_time"] - 1
                rows.append(row)
                last[strategy] = out
        emulation = summary(world.emulation_reports())
        described = str(world.run(_profile)[0]) if emulated is not None else f"real mode: {world.n} processes here"
    joined = torch.cat([r["params"] for r in last["server"] if r["role"] == "server"])
    ring = next(r["params"] for r in last["ring"] if r["role"] == "worker")
    return {"rows": rows, "same_params": bool(torch.allclose(joined, ring, atol=1e-6, rtol=0)),
            "param_bytes": param_bytes, "emulation": emulation, "profile": described,
            **({"compute": charged["compute"]} if emulated is not None else {})}


def _profile():
    from ddnb.emulate import current

    return current().profile


def table(result: dict) -> str:
    """The rows of `server_vs_ring`, one line each (with the model's time when emulated)."""
    modeled = "model_step_time" in result["rows"][0]
    kind = "emulated" if modeled else "real"
    lines = [f"{'strategy':<12} {'N':>3} {'step (' + kind + ')':>16}" + (f" {'model':>10} {'error':>7}" if modeled else "")]
    for r in result["rows"]:
        name = f"{r['servers']} server{'s' if r['servers'] > 1 else ''}" if r["strategy"] == "server" else "ring"
        line = f"{name:<12} {r['workers']:>3} {r['step_time'] * 1e3:>13.3f} ms"
        if modeled:
            line += f" {r['model_step_time'] * 1e3:>7.3f} ms {r['error']:>+7.1%}"
        lines.append(line)
    return "\n".join(lines)
