"""Solutions of `ddnb.exercises.p2p` (`notebooks/03_collectives.ipynb`)."""
from __future__ import annotations

import torch
import torch.distributed as dist

from ddnb.collectives import p2p


def ring_shift(tensor: torch.Tensor) -> torch.Tensor:
    """Send to the right, receive from the left, both posted before either is waited for:
    no rank waits for another to post first, so no circle of waits (no deadlock)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    inbox = torch.empty_like(tensor)
    handles = [dist.irecv(inbox, (rank - 1) % n), dist.isend(tensor, (rank + 1) % n)]
    for h in handles:
        h.wait()
    return inbox


def broadcast(tensor: torch.Tensor, root: int) -> None:
    """The naive broadcast: the root sends its whole tensor to each of the N - 1 others
    (traced by ddnb.collectives.p2p, so its bytes can be counted); the others receive it."""
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == root:
        sends = [p2p.isend(tensor, dst, name="broadcast") for dst in range(n) if dst != root]
        for s in sends:
            s.wait()
    else:
        p2p.irecv(tensor, root, name="broadcast").wait()
