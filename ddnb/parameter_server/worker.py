"""A parameter-server worker: pull the parameters, compute a gradient on its own shard of
the data, push the gradient; repeat (Li et al. 2014, OSDI, Sec. 3.1, Algorithm 1, the
"Worker" half).

    for each step:
        pull     send "pull" to every server j, receive "params" (S_j floats) from each
        compute  load the flat vector (S,) into the model; forward, backward on batch `clock`
        push     send "push" with the gradient slice (S_j,) to every server j
    send "done" to every server

A worker holds no optimizer and never updates parameters itself. Its batch for a step is
a pure function of (seed, worker, clock) (`worker_batch`), the clock being the step as the
server counts it (so a run restored from a checkpoint goes on with the next batches).
A "stop" instead of "params" ends the run with a ParameterServerError naming the lost
rank. Taught in `notebooks/04_parameter_server.ipynb`.
"""
from __future__ import annotations

import os
import time

import torch

from ddnb.collectives import p2p
from ddnb.data import batch, shard
from ddnb.models import flat_grads, flat_params, load_flat
from ddnb.parameter_server.messages import (DONE, PULL, PUSH, ParameterServerError, decode, empty_header,
                                            message_device, send_message)
from ddnb.trace import Tracer, get_tracer


def worker_seed(seed: int, worker: int) -> int:
    """The sampling seed of worker number `worker` (0..N-1) in a run seeded `seed`."""
    return 7919 * seed + worker


def worker_batch(dataset, worker: int, num_workers: int, batch_size: int, clock: int, seed: int):
    """(x, y) that worker number `worker` of `num_workers` computes on at step `clock`:
    batch `clock` of its shard (`ddnb.data.shard`: examples worker, worker + N, ...).
    The single-process reference concatenates these over workers."""
    return batch(shard(dataset, worker, num_workers), batch_size, clock, worker_seed(seed, worker))


def forward_backward(model, params: torch.Tensor, x, y, loss_fn, tracer: Tracer | None = None):
    """One worker's compute of a step, as written once for the servers, the co-located
    ranks and the all-reduce: load the flat parameters (S,) into `model`, forward the
    batch x (B, ...), loss against y (B,), backward; returns (loss, flat gradient (S,))."""
    load_flat(model, params)
    with get_tracer(tracer).span("compute", "forward-backward"):
        model.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        return loss, flat_grads(model)                           # (), (S,)


def pull(flat: torch.Tensor, servers, bounds, group, tracer=None, clock: int = 0) -> list[dict]:
    """Ask every server for its shard and receive them into flat (S,); returns the
    "params" headers (clock, version) in server order. Raises on a "stop"."""
    for srv in servers:
        send_message(PULL, srv, group, tracer, clock=clock)
    device = message_device(group)         # the host, or this rank's GPU on a pure nccl group
    heads = [empty_header(device) for _ in servers]
    # post every header receive at once: a server that says "stop" is always heard
    posted = [p2p.irecv(h, srv, group, tracer, name="params") for h, srv in zip(heads, servers)]
    out = []
    for h, p, srv, (a, b) in zip(heads, posted, servers, bounds):
        p.wait()
        m = decode(h)
        if m["kind"] == "stop":
            who = f"worker rank {m['arg']} was lost" if m["arg"] >= 0 else "it failed"
            raise ParameterServerError(f"rank {p2p.group_rank(group)}: server rank {srv} stopped the training at "
                                       f"version {m['version']}: {who}", ranks=[m["arg"]])
        if flat.device == device:
            p2p.recv(flat[a:b], srv, group, tracer, name="params")
        else:                              # through a buffer on the message device
            buf = torch.empty(b - a, dtype=flat.dtype, device=device)   # (S_j,)
            p2p.recv(buf, srv, group, tracer, name="params")
            flat[a:b] = buf
        out.append(m)
    return out


def work(config, model, dataset, loss_fn, shards, group, tracer: Tracer | None = None,
         t0: float | None = None) -> dict:
    """Run `config.steps` pull-compute-push steps against the servers (ranks 0..k-1 of
    `group`, a group of every rank of the world), server j holding elements
    shards[j].start..stop-1 of the flat parameter vector. If this rank is
    `config.straggler_rank` it sleeps `straggler_delay` s per step; if it is
    `config.fail_rank`, after `fail_after_steps` steps it goes silent (stops without
    "done", as if it died: fail_how="silent"), or its process exits there for real, in
    the middle of the step, after pulling (fail_how="exit": `os._exit`, no clean-up, no
    goodbye, like a crash or an OOM kill). Returns its stats (see `train`)."""
    tr, t0 = get_tracer(tracer), t0 or time.time()
    rank, workers = p2p.group_rank(group), config.worker_ranks(p2p.group_size(group))
    servers, bounds = list(range(len(shards))), [(sh.start, sh.stop) for sh in shards]
    worker, num_workers = workers.index(rank), len(workers)
    delay = config.straggler_delay if config.straggler_rank == rank else 0.0
    silent_after = config.fail_after_steps if config.fail_rank == rank else None
    flat = flat_params(model)                                    # (S,) pulled parameters
    stats = {"role": "worker", "worker": worker, "clocks": [], "versions": [], "losses": [], "times": [],
             "pushes": 0, "silent": False}
    for step in range(config.steps):
        fails = silent_after is not None and step == silent_after
        if fails and config.fail_how != "exit":
            stats["silent"] = True
            return stats
        heads = pull(flat, servers, bounds, group, tracer, clock=step)
        if fails:
            os._exit(1)
        clock = heads[0]["clock"]
        x, y = worker_batch(dataset, worker, num_workers, config.batch_size, clock, config.seed)  # (B, ...), (B,)
        loss, grad = forward_backward(model, flat, x, y, loss_fn, tracer)                          # (), (S,)
        if delay > 0:
            with tr.span("other", "straggler delay"):
                time.sleep(delay)
        for srv, (a, b), h in zip(servers, bounds, heads):
            send_message(PUSH, srv, group, tracer, payload=grad[a:b], clock=clock, version=h["version"],
                         loss=loss.item())
        stats["pushes"] += 1
        stats["clocks"].append(clock)
        stats["versions"].append([h["version"] for h in heads])
        stats["losses"].append(loss.item())
        stats["times"].append(time.time() - t0)
    for srv in servers:
        send_message(DONE, srv, group, tracer)
    return stats
