"""The digits MLP trained data-parallel on an elastic world: its state is an
`ElasticState` (`ddnb.elastic.resize`), so a `resize` between two calls of `train_steps`
changes the number of ranks and the epoch goes on where it was.

One step on M ranks reads `step_count(remaining, per_rank, M)` samples (b·M, fewer at the
tail), rank r its strided share (`ElasticSampler.next_batch`), and follows the gradient of
the mean loss over that global batch:

    loss_r = Σ_{i in batch_r} CE(x_i, y_i) / count          (count: the global batch)
    g      = Σ_r ∇loss_r                                     (all-reduce of the sums)

so an uneven tail (ranks with one sample less, or none) still gives the global mean,
and `reference_steps`, one process reading the same global batches, follows the same
path up to float rounding (the order of the sums differs). Taught in
`notebooks/15_elastic_training.ipynb`.

    cluster.run(start, functools.partial(digits_parts, seed=0), "state")
    cluster.run(train_steps, "state", steps=5, per_rank=32)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ddnb._checks import Checks
from ddnb.data import digits
from ddnb.elastic.checkpoint import ModelState
from ddnb.elastic.sampler import ElasticSampler, step_count
from ddnb.models import flat_params, mlp


def _model_and_optimizer(hidden: int, seed: int, lr: float):
    model = mlp((64, hidden, 10), seed=seed)
    return model, torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)


def digits_parts(hidden: int = 32, seed: int = 0, lr: float = 0.05) -> dict:
    """A `build` for ElasticState: {"model": ModelState(mlp, SGD with momentum), "sampler":
    ElasticSampler over the digits' train split} (pass it as functools.partial(digits_parts, ...))."""
    with Checks("digits_parts") as check:
        check.integer("hidden", hidden, min=1)
        check.integer("seed", seed, min=0)
        check.number("lr", lr, positive=True)
    model, opt = _model_and_optimizer(hidden, seed, lr)
    return {"model": ModelState(model, opt), "sampler": ElasticSampler(len(digits()[0]), seed=seed)}


def train_steps(name: str = "state", steps: int = 1, per_rank: int = 32) -> dict:
    """Runs on every rank: up to `steps` data-parallel steps of the ElasticState `name`
    (built by `digits_parts`), stopping at the end of the epoch. Returns {"losses" (the
    global mean per step), "counts" (global samples per step), "consumed", "params" (Ψ,)}."""
    import torch.distributed as dist

    from ddnb.elastic.resize import get

    with Checks("train_steps") as check:
        check.integer("steps", steps, min=1)
        check.integer("per_rank", per_rank, min=1)
    state = get(name)
    model, opt, sampler = state["model"].model, state["model"].optimizer, state["sampler"]
    train = digits()[0]
    rank, world_size = dist.get_rank(), dist.get_world_size()
    losses, counts = [], []
    for _ in range(steps):
        if sampler.remaining() == 0:
            break
        count = step_count(sampler.remaining(), per_rank, world_size)
        idx = sampler.next_batch(rank, world_size, per_rank)                 # (<= per_rank,)
        x, y = train.x[idx], train.y[idx]                                    # (b, 64), (b,)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y, reduction="sum") / count         # my part of the global mean
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)                                          # Σ_r: the global mean's gradient
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item())
        counts.append(count)
    return {"losses": losses, "counts": counts, "consumed": sampler.consumed, "params": flat_params(model)}


def reference_steps(counts: list[int], hidden: int = 32, seed: int = 0, lr: float = 0.05) -> dict:
    """One process, the same global batches: step k reads the next counts[k] samples of
    the epoch's order. Returns {"losses", "params"} to compare with `train_steps`."""
    model, opt = _model_and_optimizer(hidden, seed, lr)
    train = digits()[0]
    order = ElasticSampler(len(train), seed=seed).order()
    losses, start = [], 0
    for count in counts:
        idx = order[start:start + count]                                     # (count,)
        start += count
        opt.zero_grad()
        loss = F.cross_entropy(model(train.x[idx]), train.y[idx])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"losses": losses, "params": flat_params(model)}
