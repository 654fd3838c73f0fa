"""A decentralized parameter server: the parameters are cut into N shards and rank r, a
worker like every other rank, also *serves* shard r from a thread of its own; there is no
dedicated server rank (Li et al. 2014, OSDI, Sec. 4.3: the server group partitions the
key space; here the server group is the worker group).

    cluster.run(train_decentralized_ps, DecentralizedConfig(steps=200), model_fn, train, test)

    each rank r, asynchronously (ASP), for each step:
        pull    "pull" header to every other owner j, shard j (S_j floats) back; shard r read locally
        compute g_r at the parameters pulled
        push    gradient shard j to owner j (header + S_j floats); shard r applied locally
    the serving thread of rank r, all along: answer each "pull" with shard r, apply each
        "push" as it arrives, shard_r <- shard_r - (lr / N) g_j (N pushes move as far as one
        synchronous step with the mean gradient), under a lock shared with its own worker

The wire protocol is notebook 04's (`ddnb.parameter_server.messages`: 40-byte headers,
payloads through `ddnb.collectives.p2p`), the requests on one process group (received
from any source by the serving thread) and the replies on another (so that a worker's
receive of "params" never meets a request). Where it sits:

                          server link per step   worker link per step     waits for
    central PS (04)       2 N S                  2 S                      the server
    decentralized PS      2 (N-1) S_r + 2(S-S_r) = 4 (N-1)/N S, every rank  no one (ASP)
    ring all-reduce       -                      4 (N-1)/N S (send+recv)  everyone (BSP)

so every link carries what an all-reduce's does, spread evenly like an all-reduce, but
no rank waits for the slowest (a straggler only makes its own gradients staler).
Asynchronous: the result depends on timing, so it is tested for convergence and exact
bytes, not for equality; with one worker it is SGD exactly. The consensus distance is 0
(one model); accuracy is measured once, at the end (a measurement mid-run would need every
rank at the same step). Taught in `notebooks/05b_decentralized.ipynb`.
"""
from __future__ import annotations

import threading
from datetime import timedelta

import torch
import torch.distributed as dist

from ddnb.collectives import chunk_bounds, p2p
from ddnb.decentralized.config import DecentralizedConfig
from ddnb.decentralized.worker import Worker
from ddnb.parameter_server.messages import (DONE, HEADER_BYTES, PARAMS, PULL, PUSH, decode, empty_header,
                                            message_device, recv_any, send_message)


class ShardOwner(threading.Thread):
    """The serving half of rank r: shard r (S_r,), its lock, and the loop answering the
    other ranks' pulls and pushes until every one of them said "done"."""

    def __init__(self, shard: torch.Tensor, lr: float, others, requests, replies, tracer):
        super().__init__(name="ddnb-shard-owner", daemon=True)
        self.shard, self.lr, self.open = shard, lr, set(others)
        self.requests, self.replies, self.tracer = requests, replies, tracer
        self.lock, self.updates, self.error = threading.Lock(), 0, None

    def apply(self, grad: torch.Tensor) -> None:
        with self.lock:
            self.shard -= self.lr * grad.to(self.shard.device)
            self.updates += 1

    def read(self) -> torch.Tensor:
        with self.lock:
            return self.shard.clone()

    def run(self) -> None:
        try:
            while self.open:
                h = empty_header()
                src = recv_any(h, self.requests, self.tracer, name=lambda t: {PULL: "pull", PUSH: "push"}.get(
                    int(t[0]), "done"))
                kind = decode(h)["kind"]
                if kind == "pull":
                    send_message(PARAMS, src, self.replies, self.tracer, payload=self.read())
                elif kind == "push":
                    grad = torch.empty_like(self.shard, device=message_device(self.requests))   # (S_r,) as sent
                    p2p.recv(grad, src, self.requests, self.tracer, name="push")
                    self.apply(grad)
                else:
                    self.open.discard(src)
        except Exception as e:  # noqa: BLE001 - re-raised by the worker after join
            self.error = e


def train_decentralized_ps(config: DecentralizedConfig, model_fn, dataset, test=None, group=None, tracer=None,
                           loss_fn=None) -> dict:
    """Call on every rank: `config.steps` asynchronous steps against the N shard owners;
    `Worker` stats (params = the assembled final model on every rank) plus "updates" (the
    pushes this rank's shard took) and "bounds" of every shard."""
    w = Worker("decentralized_ps", config, model_fn, dataset, test, group, tracer, loss_fn)
    n, me = w.n, w.rank
    timeout = timedelta(seconds=60 + 10 * config.straggler_delay * config.steps)
    requests = dist.new_group(list(range(n)), timeout=timeout) if n > 1 else None
    replies = dist.new_group(list(range(n)), timeout=timeout) if n > 1 else None
    bounds = chunk_bounds(w.initial().numel(), n)
    a, b = bounds[me]
    others = [j for j in range(n) if j != me]
    owner = ShardOwner(w.initial()[a:b].clone(), config.lr / n, others, requests, replies, w.tracer)
    if n > 1:
        dist.barrier(group=requests)
    owner.start()
    x = w.initial()                                                              # (S,) the pulled copy
    for step in range(config.steps):
        for j in others:
            send_message(PULL, j, requests, w.tracer, clock=step)
        for j in others:
            h = empty_header()
            p2p.recv(h, j, replies, w.tracer, name="params")
            shard = torch.empty(bounds[j][1] - bounds[j][0], dtype=x.dtype, device=message_device(replies))
            p2p.recv(shard, j, replies, w.tracer, name="params")    # (S_j,) where send_message sent it
            x[bounds[j][0]:bounds[j][1]] = shard
        x[a:b] = owner.read()
        _, g = w.gradient(x, step)                                               # (S,)
        for j in others:
            send_message(PUSH, j, requests, w.tracer, payload=g[bounds[j][0]:bounds[j][1]], clock=step)
        owner.apply(g[a:b])
        w.tick()
    for j in others:
        send_message(DONE, j, requests, w.tracer)
    owner.join()
    if owner.error is not None:
        raise owner.error
    final = torch.cat(_gather(owner.shard, bounds, group))                      # (S,) untraced: a measurement
    stats = w.finish(final)
    stats.update(updates=owner.updates, bounds=bounds)
    return stats


def _gather(shard: torch.Tensor, bounds, group) -> list[torch.Tensor]:
    parts = [hi - lo for lo, hi in bounds]
    if len(parts) == 1:
        return [shard]
    padded = max(parts)
    buf = [shard.new_empty(padded) for _ in parts]
    mine = shard.new_zeros(padded)
    mine[:shard.numel()] = shard
    dist.all_gather(buf, mine, group=group)
    return [t[:p] for t, p in zip(buf, parts)]


def decentralized_ps_bytes(n: int, numel: int, steps: int, element_size: int = 4) -> list[dict]:
    """The formula, per rank r, for a whole run: payload (params served + gradient shards
    pushed) plus headers (a pull and a push to each other owner per step, one "params"
    header per pull served, a "done" to each at the end). Sent equals received."""
    out = []
    for lo, hi in chunk_bounds(numel, n):
        s_r, s = (hi - lo) * element_size, numel * element_size
        payload = steps * (s - s_r) + steps * (n - 1) * s_r
        headers = HEADER_BYTES * ((n - 1) * 3 * steps + (n - 1))
        out.append({"sent": payload + headers, "received": payload + headers})
    return out
