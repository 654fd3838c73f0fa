"""Solutions of `ddnb.exercises.collectives` (`notebooks/05_allreduce.ipynb`)."""
from __future__ import annotations

import torch
import torch.distributed as dist


def ring_allreduce(tensor: torch.Tensor) -> None:
    """Sum all-reduce in place: N-1 reduce-scatter steps, then N-1 all-gather steps
    (Patarasuk & Yuan 2009); rank r sends chunk (r - s) mod N to r+1 at step s."""
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = list(tensor.view(-1).tensor_split(n))          # views: writing them writes tensor
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(2 * (n - 1)):
        send_i = (rank - step) % n
        recv_i = (rank - step - 1) % n
        incoming = torch.empty_like(chunks[recv_i])
        reqs = [dist.isend(chunks[send_i].contiguous(), right), dist.irecv(incoming, left)]
        for r in reqs:
            r.wait()
        if step < n - 1:
            chunks[recv_i] += incoming        # reduce-scatter: accumulate
        else:
            chunks[recv_i].copy_(incoming)    # all-gather: overwrite with the finished chunk
