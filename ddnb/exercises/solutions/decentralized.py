"""Solutions of `ddnb.exercises.decentralized`, taught in `notebooks/05b_decentralized.ipynb`."""
from __future__ import annotations

import torch
import torch.distributed as dist


def gossip_step(x: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """x_i <- sum_j W[i, j] x_j: send x to every k with W[k, i] > 0, receive from every j
    with W[i, j] > 0, all posted at once."""
    me, n = dist.get_rank(), dist.get_world_size()
    inbox = {j: torch.empty_like(x) for j in range(n) if j != me and W[me, j] > 0}
    ops = [dist.P2POp(dist.isend, x, k) for k in range(n) if k != me and W[k, me] > 0]
    ops += [dist.P2POp(dist.irecv, buf, j) for j, buf in inbox.items()]
    for work in dist.batch_isend_irecv(ops) if ops else []:
        work.wait()
    out = W[me, me] * x
    for j, buf in inbox.items():
        out = out + W[me, j] * buf
    return out


RING8_GAP = 1 - (1 + 2 * 0.7071067811865476) / 3        # 1 - (1 + 2 cos(2 pi / 8)) / 3
