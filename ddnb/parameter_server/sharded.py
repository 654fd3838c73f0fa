"""Sharded parameter servers, and the co-located variant where every rank is one.

Sharding (Li et al. 2014, OSDI, Sec. 4.3: the server group partitions the key space, each
server node holds one range): the flat parameter vector (S bytes, model order) is cut
into k contiguous element ranges, server j holding range j; a worker pulls and pushes
range j from and to server j only. Two ways to cut (`shard_parameters`):

    by="layer"  whole layers (the parameters of one module: a Linear's weight and bias),
                contiguous, grouped so that the largest shard is as small as possible.
                Layers differ in size, so the shards do: MLP (64, 128, 10) on k = 2 is
                8320 / 1290 parameters.
    by="bytes"  k near-equal ranges, cut anywhere (`ddnb.collectives.chunk_bounds`).

Per step, N workers, payload bytes only (`bytes_per_step`):

    central server  sends N·S, receives N·S            its link carries 2·N·S
    k shards        server j sends and receives N·S_j  2·N·S/k each when by="bytes"
    co-located      every rank sends and receives 2·(N-1)/N·S

Co-located (`train_colocated`, BSP only): every rank is a worker and the server of shard
`rank`. A step is: send my shard of the parameters to every rank and receive theirs
(an all-gather: the pull), compute my gradient, send gradient shard j to rank j and
receive my shard of every rank's gradient (a reduce-scatter: the push), average it and
update my shard with my optimizer. A reduce-scatter then an all-gather is an all-reduce
(Patarasuk & Yuan 2009, JPDC 69(2)), made here of N-1 direct messages each way instead of
a ring's N-1 steps to neighbours, with the same 2(N-1)/N·S bytes per rank: the bridge
from this notebook to `notebooks/05_allreduce.ipynb`. ZeRO's optimizer-state sharding
(Rajbhandari et al. 2020) is this same layout.
"""
from __future__ import annotations

import time
from typing import NamedTuple

import torch
from torch import nn

from ddnb._checks import Checks
from ddnb.collectives import chunk_bounds, p2p
from ddnb.models import flat_params, load_flat
from ddnb.parameter_server.messages import ParameterServerError, message_device, wait_within
from ddnb.parameter_server.server import Server
from ddnb.parameter_server.worker import forward_backward, worker_batch
from ddnb.trace import get_tracer

BY = ("layer", "bytes")


class Shard(NamedTuple):
    """Elements start..stop-1 of the flat parameter vector, and the parameters they touch."""
    start: int
    stop: int
    names: tuple

    @property
    def numel(self) -> int:
        return self.stop - self.start


def _named(params) -> list[tuple[str, torch.Tensor]]:
    if isinstance(params, nn.Module):
        return list(params.named_parameters())
    items = list(params)
    return [it if isinstance(it, tuple) else (str(i), it) for i, it in enumerate(items)]


def _balanced_cuts(sizes: list[int], k: int) -> list[int]:
    """Cut `sizes` into k contiguous non-empty groups minimizing the largest group's sum
    (dynamic programming over (groups, prefix)); returns the k+1 cut indices."""
    n, prefix = len(sizes), [0]
    for s in sizes:
        prefix.append(prefix[-1] + s)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(k + 1)]   # best[j][i]: first i units in j groups
    cut = [[0] * (n + 1) for _ in range(k + 1)]
    best[0][0] = 0
    for j in range(1, k + 1):
        for i in range(j, n + 1):
            for m in range(j - 1, i):
                cost = max(best[j - 1][m], prefix[i] - prefix[m])
                if cost < best[j][i]:
                    best[j][i], cut[j][i] = cost, m
    cuts, i = [n], n
    for j in range(k, 0, -1):
        i = cut[j][i]
        cuts.append(i)
    return cuts[::-1]


def shard_parameters(params, k: int, by: str = "bytes") -> list[Shard]:
    """Split the flat parameter vector of `params` (a module, or tensors, or (name,
    tensor) pairs, in model order) into k contiguous shards, one per server."""
    with Checks("shard_parameters") as check:
        check.choice("by", by, BY)
        check.integer("k", k, min=1, why=" (servers)")
    named = _named(params)
    sizes = [t.numel() for _, t in named]
    numel = sum(sizes)
    if by == "bytes":
        if numel < k:
            raise ValueError(f"{numel} parameters cannot fill k={k} shards: need k <= {numel}")
        bounds = chunk_bounds(numel, k)
    else:   # layers: consecutive parameters of one module (the name before the last dot)
        layers: list[tuple[str, list[int]]] = []
        for i, (name, _) in enumerate(named):
            owner = name.rpartition(".")[0] or name
            if layers and layers[-1][0] == owner:
                layers[-1][1].append(i)
            else:
                layers.append((owner, [i]))
        if k > len(layers):
            raise ValueError(f"shard_by='layer' needs at least one layer per server: {len(layers)} layers "
                             f"({', '.join(o for o, _ in layers)}) for k={k} servers; use shard_by='bytes' "
                             f"or fewer servers")
        layer_sizes = [sum(sizes[i] for i in idx) for _, idx in layers]
        cuts = _balanced_cuts(layer_sizes, k)
        starts = [0]
        for size in layer_sizes:
            starts.append(starts[-1] + size)
        bounds = [(starts[cuts[j]], starts[cuts[j + 1]]) for j in range(k)]
    offsets = [0]
    for s in sizes:
        offsets.append(offsets[-1] + s)
    return [Shard(a, b, tuple(name for (name, _), lo, hi in zip(named, offsets, offsets[1:]) if lo < b and hi > a))
            for a, b in bounds]


def bytes_per_step(param_bytes: int, workers: int, servers: int = 1, colocated: bool = False) -> dict:
    """Payload bytes one step moves, per link (see the table in the module docstring):
    {"server_sent", "server_received", "worker_sent", "worker_received"}; with
    colocated=True every rank is both and `servers` is ignored."""
    s, n = param_bytes, workers
    if colocated:
        each = (n - 1) * s / n
        return {"server_sent": each, "server_received": each, "worker_sent": each, "worker_received": each}
    return {"server_sent": n * s / servers, "server_received": n * s / servers,
            "worker_sent": s, "worker_received": s}


def final_params(results: list[dict]) -> torch.Tensor:
    """The trained flat parameter vector (S,), put together from the shards that the
    server (or co-located) ranks of `train` returned."""
    states = sorted((r["state"] for r in results if r.get("state") is not None), key=lambda s: s["bounds"][0])
    at = 0
    for st in states:
        if st["bounds"][0] != at:
            raise ValueError(f"shards {[tuple(s['bounds']) for s in states]} do not tile the parameter vector")
        at = st["bounds"][1]
    if not states:
        raise ValueError("no server state among the results (pass the list that train returned on every rank)")
    return torch.cat([st["params"] for st in states])


def assemble(results: list[dict], model_fn) -> nn.Module:
    """model_fn() with the trained parameters of `results` loaded (for test accuracy)."""
    return load_flat(model_fn(), final_params(results))


def _wait(pendings, me: int, timeout: float) -> None:
    """Wait for each posted message (receives first), each within `timeout` s, else raise
    naming the peer (a timed-out wait breaks this run's group: it is not used again)."""
    for p in sorted(pendings, key=lambda p: p.kind != "recv"):
        try:
            wait_within(p, timeout)
        except RuntimeError as e:
            way = "from" if p.kind == "recv" else "to"
            raise ParameterServerError(
                f"rank {me}: the {p.name} message {way} rank {p.peer} did not complete within worker_timeout="
                f"{timeout} s: rank {p.peer} is lost or hung, and co-located training (bsp) cannot go on "
                f"without it", ranks=[p.peer]) from e


def _swap(me: int, recv_into: dict, send_from: dict, group, tracer, name: str) -> list:
    """Post, for each peer j, the receive into recv_into[j] and the send of send_from[j]:
    the lower rank of a pair sends first, the higher receives first, so that nccl, which
    runs a pair's messages in order on one stream, matches them (gloo takes any order)."""
    posted = []
    for j in sorted(recv_into):
        ops = [lambda: p2p.isend(send_from[j], j, group, tracer, name=name),
               lambda: p2p.irecv(recv_into[j], j, group, tracer, name=name)]
        posted += [op() for op in (ops if me < j else ops[::-1])]
    return posted


def train_colocated(config, model, dataset, loss_fn, shards: list[Shard], server: Server, group, tracer=None,
                    t0: float | None = None) -> dict:
    """BSP where rank r is a worker and `server`, the server of shards[r] (see the module
    docstring). The messages live on the group's `message_device` (this rank's GPU on a
    pure nccl group), the model and the server where they were built."""
    tr, t0 = get_tracer(tracer), t0 or time.time()
    n, me = p2p.group_size(group), p2p.group_rank(group)
    a, b = shards[me].start, shards[me].stop
    device = message_device(group)
    flat = flat_params(model)                                            # (S,)
    stats = {"role": "colocated", "worker": me, "shard": me, "bounds": (a, b), "mode": "bsp",
             "start_version": server.version, "clocks": [], "versions": [], "losses": [], "times": [],
             "pushes": 0, "silent": False, "updates": 0, "gradients": 0, "dropped": 0, "applied": [],
             "history": [], "lost": []}
    others = [j for j in range(n) if j != me]
    for step in range(config.steps):
        if config.fail_rank == me and step == config.fail_after_steps:
            stats["silent"] = True
            return stats
        # pull = all-gather: my shard to every rank, every rank's shard into place
        flat[a:b] = server.params.detach()
        wire = flat.to(device)                                           # (S,) flat itself on the host
        posted = _swap(me, {j: wire[shards[j].start:shards[j].stop] for j in others},
                       {j: wire[a:b] for j in others}, group, tracer, "params")
        _wait(posted, me, config.worker_timeout)
        if wire is not flat:
            flat.copy_(wire)
        clock = server.version
        x, y = worker_batch(dataset, me, n, config.batch_size, clock, config.seed)   # (B, ...), (B,)
        loss, grad = forward_backward(model, flat, x, y, loss_fn, tracer)             # (), (S,)
        if config.straggler_rank == me and config.straggler_delay > 0:
            with tr.span("other", "straggler delay"):
                time.sleep(config.straggler_delay)
        # push = reduce-scatter: gradient shard j to rank j, my shard of every gradient here
        grad = grad.to(device)                                           # (S,)
        mine = torch.empty(n, b - a, device=device)                      # (N, S_me)
        mine[me] = grad[a:b]
        posted = _swap(me, {j: mine[j] for j in others},
                       {j: grad[shards[j].start:shards[j].stop] for j in others}, group, tracer, "push")
        _wait(posted, me, config.worker_timeout)
        with tr.span("compute", "update"):
            server.apply(mine.mean(0))
        server.clocks = {w: server.version for w in server.clocks}
        now = time.time() - t0
        stats["updates"] += 1
        stats["gradients"] += n
        stats["history"].append({"time": now, "version": server.version, "loss": loss.item()})
        stats["applied"] += [{"worker": w, "clock": clock, "read_version": clock, "version": clock,
                              "time": now, "staleness": 0} for w in range(n)]
        stats["pushes"] += 1
        stats["clocks"].append(clock)
        stats["versions"].append([clock])
        stats["losses"].append(loss.item())
        stats["times"].append(now)
    stats.update(version=server.version, worker_clocks=dict(server.clocks), state=server.state_dict())
    return stats
