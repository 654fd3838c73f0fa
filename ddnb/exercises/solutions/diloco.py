"""Solutions of `ddnb.exercises.diloco`, taught in `notebooks/16b_slow_link.ipynb`."""
from __future__ import annotations

import torch.distributed as dist


def outer_step(local_params, global_params, momentum_buffers, lr=0.7, momentum=0.9):
    """Average the deltas theta - theta_i over the ranks, then Nesterov SGD on theta."""
    out = []
    for theta_i, theta, b in zip(local_params, global_params, momentum_buffers):
        delta = theta - theta_i
        dist.all_reduce(delta)
        delta /= dist.get_world_size()
        b.mul_(momentum).add_(delta)
        out.append(theta - lr * (delta + momentum * b))
    return out
