"""Training with the naive layer split, and the one-process reference it is checked against.

`train_split` runs on every rank of a cluster: it builds the small GPT of `ddnb.models`,
keeps this rank's stage (`NaiveModelParallel`), trains it with Adam on the sequence-
reversal task, measures its memory (`ddnb.memory`) and traces the last steps;
`train_single` is the unsplit model in one process on the same data with the same
optimizer. Adam is per-parameter, so each rank stepping its own stage's parameters is the
same update as one optimizer over the whole model: the two give the same gradients and
the same loss curve (the chain rule across each boundary). `median_step` and `step_summary`
read the traces: per-rank compute time and idle fraction of a step, 1 - t_r / Σ t on
average (p - 1)/p (Huang et al. 2019, GPipe, Sec. 2.2). Taught in
`notebooks/08_model_parallelism.ipynb`.

    split = cluster.run(train_split, GPTConfig(), "params", 10)   # one dict per rank
    single = train_single(GPTConfig(), 10)
    step = median_step(split)                                     # events of all ranks
    step_summary(step, 4)                                         # {"step", "compute", "idle"}
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ddnb.memory import SavedActivations, model_memory
from ddnb.models import gpt, lm_loss, synthetic_task
from ddnb.pipeline_parallel.naive import NaiveModelParallel, idle_fractions, partition_layers
from ddnb.timing import barrier_and_clock
from ddnb.trace import Tracer


def train_split(cfg, strategy="equal", steps=10, lr=3e-3, batch=32, times=None, trace_last=5, seed=0,
                bounds=None):
    """Train the layer-split GPT on this rank's stage; returns {"bounds", "losses" (one per
    step: floats on the last stage, None elsewhere), "grads" (this stage's after the first step, in parameter
    order), "traces" (one event list per traced step), "memory" (bytes: parameters,
    gradients, optimizer, activations)}. Call on every rank of the world at once.

    `bounds`: the partition itself ([(start, end), ...], one per stage); with fewer stages
    than ranks, the first len(bounds) ranks train in a group of their own and the others
    return None. Without it, `partition_layers(model, world_size, strategy, times)`."""
    from ddnb.collectives.devices import rank_device

    device = rank_device()                                 # cuda:local_rank when nccl is in the backend, else cpu
    model = gpt(cfg, seed=seed)
    n = dist.get_world_size()
    if bounds is None:
        bounds = partition_layers(model, n, strategy, times=times)
    bounds = [tuple(b) for b in bounds]
    if not 1 <= len(bounds) <= n:                          # the same answer on every rank: all raise
        raise ValueError(f"{len(bounds)} stages in bounds for a world of {n} ranks: 1 to {n} stages")
    group = None if len(bounds) == n else dist.new_group(list(range(len(bounds))))
    if dist.get_rank() >= len(bounds):
        return None
    tracer = Tracer(rank=dist.get_rank())
    barrier, _ = barrier_and_clock()                       # torch's, or an emulated cluster's
    stage = NaiveModelParallel(model, bounds, group=group, tracer=tracer, device=device)
    del model                                              # keep only this rank's layers
    opt = torch.optim.Adam(stage.parameters(), lr=lr)
    act = SavedActivations()
    losses, traces, grads = [], [], None
    for step, (idx, targets) in enumerate(synthetic_task(cfg, batch, steps, seed)):
        tracer.enabled = step >= steps - trace_last
        if tracer.enabled:
            barrier(group=group)                           # traced steps start together (not traced)
        opt.zero_grad()
        with act:
            losses.append(stage.forward_backward(idx, targets, lm_loss))   # None but on the last stage
        if step == 0:
            grads = [p.grad.cpu().clone() for p in stage.parameters()]
        opt.step()
        if tracer.enabled:
            traces.append(tracer.take())
    memory = dict(model_memory(stage, opt), activations=act.peak)
    if group is not None:
        barrier(group=group)                               # every message of the group is done
        dist.destroy_process_group(group)
    return {"bounds": bounds, "losses": losses, "grads": grads, "traces": traces, "memory": memory}


def train_single(cfg, steps=10, lr=3e-3, batch=32, seed=0):
    """The reference: the unsplit model in this process, same data, same optimizer.
    Returns {"losses", "grads" (after the first step), "memory"} as `train_split` does."""
    model = gpt(cfg, seed=seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    act = SavedActivations()
    losses, grads = [], None
    for step, (idx, targets) in enumerate(synthetic_task(cfg, batch, steps, seed)):
        opt.zero_grad()
        with act:
            loss = lm_loss(model(idx), targets)            # idx (B, T) -> logits (B, T, vocab)
            loss.backward()
        if step == 0:
            grads = [p.grad.clone() for p in model.parameters()]
        opt.step()
        losses.append(loss.item())
    return {"losses": losses, "grads": grads, "memory": dict(model_memory(model, opt), activations=act.peak)}


def median_step(results):
    """The traced step (events of all ranks) whose duration is the median: on a shared
    machine step times are noisy. `results`: `train_split`'s dicts (None entries, ranks
    outside the stages, are skipped)."""
    results = [r for r in results if r is not None]
    steps = [[e for r in results for e in r["traces"][k]] for k in range(len(results[0]["traces"]))]
    duration = lambda ev: max(e["end"] for e in ev) - min(e["start"] for e in ev)
    return sorted(steps, key=duration)[len(steps) // 2]


def step_summary(events, world_size: int) -> dict:
    """One traced step read back: "step" (seconds, first start to last end), "compute"
    (seconds of compute per rank) and "idle" (fraction of the step outside compute, per
    rank: `idle_fractions`)."""
    compute = [sum(e["end"] - e["start"] for e in events if e["kind"] == "compute" and e["rank"] == r)
               for r in range(world_size)]
    step = max(e["end"] for e in events) - min(e["start"] for e in events)
    return {"step": step, "compute": compute, "idle": idle_fractions(events, world_size)}


def grads_match(split, single, atol: float = 1e-5) -> bool:
    """Whether the first step's gradients of all stages, in rank order (= parameter
    order), equal the unsplit model's within `atol`."""
    got = [g for r in split if r is not None for g in r["grads"]]
    return len(got) == len(single["grads"]) and all(
        a.shape == b.shape and torch.allclose(a, b, atol=atol, rtol=0) for a, b in zip(got, single["grads"]))


def all_partitions(n_layers: int, stages: int) -> list[list[tuple[int, int]]]:
    """Every way to cut `n_layers` layers into `stages` contiguous non-empty stages, as
    bounds lists, in lexicographic order of the cut points: C(n_layers - 1, stages - 1)."""
    from itertools import combinations

    if not 1 <= stages <= n_layers:
        raise ValueError(f"stages({stages}) must be in 1..layers({n_layers}): every stage needs a layer")
    return [list(zip((0, *cuts), (*cuts, n_layers))) for cuts in combinations(range(1, n_layers), stages - 1)]
