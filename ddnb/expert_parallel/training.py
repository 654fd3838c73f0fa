"""Data × expert parallelism: a 2-D grid (ddnb.ProcessGrid(dp, ep)) training one
mixture-of-experts layer, equal to one process training it on the global batch.

Rank (dp_rank, ep_rank) holds experts [ep_rank·E/ep, (ep_rank+1)·E/ep) (the same experts
as the other ranks of its dp group) and a copy of the router, and reads chunk `rank` of
the global batch (every rank reads different tokens: both axes split the data). A step:

  1. ExpertParallelMoE forward over the ep group (dispatch and combine all-to-alls),
     loss of this rank's tokens scaled so that the sum over ranks is the global loss;
  2. backward: each expert's gradient arrives at its owner through the reversed
     all-to-alls, from the ep group's tokens;
  3. expert gradients summed over the dp group (the replicas of those experts saw the
     other dp rows), router gradients over the whole grid (ep group, then dp group);
  4. SGD step on every rank.

So rank r's experts follow the reference's experts r's ep shard (GShard's layout,
Lepikhin et al. 2020, Sec. 3.2: experts split over devices, the rest replicated).
Taught in `notebooks/13_sequence_context_expert.ipynb`.

    out = train_dp_ep(ProcessGrid(dp=2, ep=2), steps=3)   # == train_moe_reference(steps=3)
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ddnb.expert_parallel.moe import ExpertParallelMoE, MoE, sync_router_grads

SIZES = {"d_model": 6, "d_hidden": 8, "num_experts": 4, "top_k": 2, "capacity_factor": 1.25}
AUX = 0.01      # Switch's alpha


def _batches(steps: int, tokens: int, d: int, seed: int):
    g = torch.Generator().manual_seed(seed + 1)
    return [(torch.randn(tokens, d, generator=g, dtype=torch.float64),
             torch.randn(tokens, d, generator=g, dtype=torch.float64)) for _ in range(steps)]


def train_moe_reference(steps: int = 3, dp: int = 2, ep: int = 2, tokens_per_rank: int = 8, lr: float = 0.1,
                        seed: int = 0) -> dict:
    """One process, the global batch, routed in dp·ep groups of tokens_per_rank (as the
    ranks route). Returns {"losses", "params": per rank of the grid, the parameters that
    rank should hold, by its ExpertParallelMoE's names}."""
    world = dp * ep
    moe = MoE(**SIZES, normalize=True, seed=seed).double()
    opt = torch.optim.SGD(moe.parameters(), lr=lr)
    losses = []
    for x, target in _batches(steps, world * tokens_per_rank, SIZES["d_model"], seed):
        opt.zero_grad()
        y, aux = moe(x, groups=world)
        loss = ((y - target) ** 2).mean() + AUX * aux
        loss.backward()
        opt.step()
        losses.append(loss.item())
    per = SIZES["num_experts"] // ep
    params = []
    for rank in range(world):
        e = rank % ep                                                   # ep varies faster than dp
        mine = {"router.weight": moe.router.weight.detach()}
        for i in range(per):
            for name, p in moe.experts[e * per + i].named_parameters():
                mine[f"experts.{i}.{name}"] = p.detach()
        params.append(mine)
    return {"losses": losses, "params": params}


def train_dp_ep(grid, steps: int = 3, tokens_per_rank: int = 8, lr: float = 0.1, seed: int = 0) -> dict:
    """Train the MoE of `train_moe_reference` on grid's dp × ep axes (the others must be
    1). Returns {"losses": the global loss per step (every rank), "model": this rank's
    ExpertParallelMoE}."""
    others = {a: grid.sizes[a] for a in ("pp", "tp", "cp") if grid.sizes[a] != 1}
    if others:
        raise ValueError(f"train_dp_ep uses the dp and ep axes only, got {others}")
    world = grid.world_size
    model = ExpertParallelMoE.from_module(MoE(**SIZES, normalize=True, seed=seed).double(), grid.group("ep"))
    dp_group, experts = grid.group("dp"), list(model.experts.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for x, target in _batches(steps, world * tokens_per_rank, SIZES["d_model"], seed):
        rows = slice(grid.rank * tokens_per_rank, (grid.rank + 1) * tokens_per_rank)   # my chunk (T/world, d)
        opt.zero_grad()
        y, aux = model(x[rows])
        loss = ((y - target[rows]) ** 2).sum() / target.numel() + AUX * aux / world   # Σ over ranks = global
        loss.backward()
        sync_router_grads(model)                                        # over ep
        for p in [*experts, *model.router.parameters()]:
            dist.all_reduce(p.grad, group=dp_group)                     # over dp
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item())
    return {"losses": losses, "model": model}
