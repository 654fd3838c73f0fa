"""Data × tensor parallelism: a 2-D grid where each tp group holds one tensor-parallel copy
of the model and the dp groups average gradients between the copies.

On a ProcessGrid(dp, tp) (ddnb.process_grid), rank (dp_rank, tp_rank):
  1. reads the dp_rank-th shard of the global batch (the same shard as the other ranks of
     its tp group: tensor parallelism splits the model, not the data);
  2. runs the TensorParallelGPT forward and backward inside its tp group (two
     all-reduces per layer each way, transformer.py);
  3. all-reduces its gradients (one flat buffer) over its dp group and divides by dp: the
     ranks of a dp group hold the *same* shard of each weight, so this is plain data
     parallelism (ddnb.data_parallel.naive) shard by shard;
  4. takes the optimizer step on its shards.
So the gradient is the global-batch gradient and every shard follows the single-process
run on the global batch (Narayanan et al. 2021, arXiv 2104.04473, Sec. 2.3; Megatron-LM's
"data parallel groups" of Shoeybi et al. 2019, Sec. 3, Fig. 8). Taught in
`notebooks/10_tensor_parallelism.ipynb`.

    grid = ProcessGrid(dp=2, tp=2)
    out = train_dp_tp(grid, cfg, steps=20)      # out["losses"]: the global-batch loss per step
"""
from __future__ import annotations


import torch
import torch.distributed as dist
from torch import nn

from ddnb.collectives import traced
from ddnb.models import GPTConfig, gpt, lm_loss, synthetic_task
from ddnb.tensor_parallel.layers import check_divisible
from ddnb.tensor_parallel.transformer import TensorParallelGPT
from ddnb.trace import Tracer


@torch.no_grad()
def allreduce_gradients(model: nn.Module, group=None, tracer: Tracer | None = None) -> None:
    """p.grad <- mean of p.grad over `group` for every parameter, with one all-reduce of
    all the gradients flattened into one buffer (one latency per step, not one per
    parameter: the single-bucket form of ddnb.data_parallel.BucketedDataParallel)."""
    size = dist.get_world_size(group)
    params = list(model.parameters())
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if size == 1:
        return
    flat = torch.cat([p.grad.reshape(-1) for p in params])               # (numel,)
    traced.all_reduce(flat, group, tracer, "dp allreduce gradients", as_op="dp_all_reduce", phase="step")
    flat.div_(size)
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
        offset += p.numel()


def _optimizer(params, name: str, lr: float):
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    raise ValueError(f"optimizer={name!r} is not one of ['sgd', 'adam']")


def train_reference(config: GPTConfig, steps: int = 10, batch_size: int = 8, lr: float = 1e-2,
                    optimizer: str = "adam", seed: int = 0) -> dict:
    """The single-process run that train_dp_tp must match: the global batch on one model."""
    model = gpt(config, seed=seed)
    opt = _optimizer(model.parameters(), optimizer, lr)
    losses = []
    for idx, targets in synthetic_task(config, batch_size=batch_size, steps=steps, seed=seed):
        opt.zero_grad()
        loss = lm_loss(model(idx), targets)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"losses": losses, "model": model}


def train_dp_tp(grid, config: GPTConfig, steps: int = 10, batch_size: int = 8, lr: float = 1e-2,
                optimizer: str = "adam", seed: int = 0, tracer: Tracer | None = None) -> dict:
    """Train gpt(config, seed) on the reversal task over grid's dp × tp axes (grid.pp must
    be 1). batch_size is the global batch, split over dp. Returns {"losses": the
    global-batch loss per step (the same on every rank), "model": this rank's
    TensorParallelGPT}."""
    if grid.pp != 1:
        raise ValueError(f"train_dp_tp uses the dp and tp axes only, got pp({grid.pp}) != 1")
    check_divisible("batch_size", batch_size, grid.dp, " (the global batch is split over the dp ranks)")
    model = TensorParallelGPT.from_module(gpt(config, seed=seed), grid.group("tp"), tracer)
    dp_group, dp_rank, per_rank = grid.group("dp"), grid.coords().dp, batch_size // grid.dp
    opt = _optimizer(model.parameters(), optimizer, lr)
    losses = []
    for idx, targets in synthetic_task(config, batch_size=batch_size, steps=steps, seed=seed):
        rows = slice(dp_rank * per_rank, (dp_rank + 1) * per_rank)          # my dp shard (B/dp, T)
        opt.zero_grad()
        loss = model.loss(idx[rows], targets[rows])
        loss.backward()
        allreduce_gradients(model, dp_group, tracer)                       # mean over the dp group
        opt.step()
        # every shard has the same number of scored targets, so the mean of the shards'
        # losses is the global batch's loss
        total = loss.detach().clone()
        dist.all_reduce(total, group=dp_group)
        losses.append(total.item() / grid.dp)
    return {"losses": losses, "model": model}
