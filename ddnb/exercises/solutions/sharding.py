"""Solutions of `ddnb.exercises.sharding` (`notebooks/11_memory_sharding.ipynb`)."""
from __future__ import annotations

import torch
import torch.distributed as dist

from ddnb.compat import all_gather_single, reduce_scatter_single


def zero1_step(flat, grad, state, lr=0.1, momentum=0.9):
    """One ZeRO-1 step of SGD with momentum (Rajbhandari et al. 2020, Sec. 5.1): flat (N·S,)
    the parameters, the same on every rank, updated in place; grad (N·S,) this rank's
    gradient; state a dict kept between steps, holding only this rank's (S,) momentum."""
    n, r = dist.get_world_size(), dist.get_rank()
    S = flat.numel() // n
    g = torch.empty(S, dtype=grad.dtype)
    reduce_scatter_single(g, grad)                 # Σ_ranks of my slice of the gradient
    g /= n                                         # the data-parallel mean
    m = state.setdefault("momentum", torch.zeros(S, dtype=grad.dtype))   # (S,): my shard of the state
    m.mul_(momentum).add_(g)
    mine = flat[r * S:(r + 1) * S] - lr * m        # (S,) my updated parameters
    all_gather_single(flat, mine)                  # everyone's shards -> the whole (N·S,)
