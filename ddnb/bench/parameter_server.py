"""The parameter-server harnesses: each starts a `ddnb.testing.World` (real or emulated)
and runs a parameter server's per-rank step on it, the model of that step beside the run.

    server_vs_ring      `ddnb.parameter_server.saturation.train_fixed_peers` per worker count,
                        k servers against the ring all-reduce, each row beside its model
                        (`model_step_time`, with the compute `charged_compute` charges); `table`
                        prints the rows (`python -m ddnb.bench ps`, `ddnb.bench.ps`)
    emulated_step_times `ddnb.parameter_server.hierarchical.train_hierarchical` grouped by the
                        profile's hosts and flat, on one emulated World

    sat = server_vs_ring("10gbe", partial(mlp, (64, 1024, 64, 10)), train_set, workers=(1, 2, 4, 8))
    print(table(sat))

Taught in `notebooks/04_parameter_server.ipynb` (the server's link saturating) and
`notebooks/05b_decentralized.ipynb` (the hierarchical server).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ddnb._checks import Checks
from ddnb.data import Dataset
from ddnb.models import flat_params
from ddnb.parameter_server.hierarchical import train_hierarchical
from ddnb.parameter_server.saturation import model_step_time, train_fixed_peers
from ddnb.parameter_server.worker import forward_backward, worker_batch


def charged_compute(profile, model_fn, dataset, batch_size: int = 32, lr: float = 0.05) -> dict:
    """The model's compute, from the operations each role of `train_fixed_peers` runs
    (`ddnb.parameter_server.saturation`'s docstring), on `profile`'s device:
    {"compute": c, "server_update": fn(N, k) -> U_k, "ring_update": fn(N) -> U}."""
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


def emulated_step_times(profile, model_fn, dataset, world_size: int = 5, steps: int = 4, timeout: float = 120) -> dict:
    """The step of `train_hierarchical` on an emulated cluster of `profile` (its hosts are
    `profile.ranks_per_host` ranks), grouped by those hosts and flat (every worker its own
    "host": all messages to the server): {"hierarchical", "flat"}: the median emulated
    seconds per step after the first, "same_params": the two runs' parameters agree
    (1e-6), "emulation": the run's summary line."""
    from ddnb.emulate import get_profile, summary
    from ddnb.testing import World

    profile = get_profile(profile)
    with World(world_size, emulate=profile, timeout=timeout) as world:
        grouped = world.run(train_hierarchical, model_fn, dataset, profile.ranks_per_host, steps)[0]
        flat = world.run(train_hierarchical, model_fn, dataset, 1, steps)[0]
        emulation = summary(world.emulation_reports())
    return {"hierarchical": _median(grouped["times"]), "flat": _median(flat["times"]),
            "same_params": bool(torch.allclose(grouped["params"], flat["params"], atol=1e-6, rtol=0)),
            "emulation": emulation}
