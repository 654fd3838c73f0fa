"""Solution of `ddnb.exercises.parameter_server` (`notebooks/04_parameter_server.ipynb`)."""
from __future__ import annotations

import torch
import torch.distributed as dist


def ps_step(params: torch.Tensor, compute_grad, lr: float) -> None:
    """One BSP step; rank 0 is the server, ranks 1..N-1 the workers (Li et al. 2014, Alg. 1)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        for w in range(1, n):                               # answer every worker's pull
            dist.send(params, w)
        grads = [torch.empty_like(params) for _ in range(1, n)]
        for w, g in zip(range(1, n), grads):                # receive every worker's push
            dist.recv(g, w)
        params -= lr * torch.stack(grads).mean(0)           # apply: SGD with their mean, in place
    else:
        dist.recv(params, 0)                                # pull
        dist.send(compute_grad(params), 0)                  # compute, push
