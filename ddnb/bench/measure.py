"""Measure the α-β-γ model's parameters, two all-reduces and a data-parallel step on the
first n ranks of a cluster: the measurements that `notebooks/12_scalability.ipynb`
compares with `ddnb.cost.scaling`'s predictions at 2, 4 and 8 workers.

    meas = cluster.run(measure_first, 4)[0]    # rank 0's result; the ranks >= 4 return None

The fits follow Thakur, Rabenseifner & Gropp 2005 (a message of n bytes costs α + nβ,
reducing n bytes nγ): `ddnb.cost.fit_alpha_beta` on the ping-pong and sendrecv times.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ddnb._checks import Checks


def measure_first(n: int, size: int = 1 << 20, iters: int = 8, pingpong_sizes=()) -> dict | None:
    """On ranks [0, n) (a group every rank creates; ranks >= n return None), time with
    `ddnb.timing.time_collective` (the slowest rank's mean of `iters`):

        pingpong        ranks 0 and 1, one time per size of `pingpong_sizes` (if any)
        sendrecv        every rank to its right neighbour at once, at 4 KB, the ring's
                        chunk (size / n) and `size` bytes (sizes in sendrecv_sizes)
        gamma           seconds per byte of a local add, the largest over the ranks
        ring, tree      ddnb's from-scratch all-reduce of `size` bytes
        compute, step   one data-parallel SGD step of an MLP 64-256-256-10 (64 examples
                        per rank) without and with one ring all-reduce of its flat
                        gradient (grad_bytes bytes)

    Returns a dict of those keys (seconds) and "n". Call it on every rank at once.
    """
    from ddnb.collectives import ALLREDUCES, ring_allreduce
    from ddnb.bench.links import measure_gamma, pingpong, sendrecv
    from ddnb.models import flat_grads, mlp
    from ddnb.collectives.devices import rank_device
    from ddnb.timing import time_collective

    with Checks("measure_first") as check:
        check.integer("n", n, min=2 if pingpong_sizes else 1, max=dist.get_world_size())
        check.positive_ints(size=size, iters=iters)
    device = rank_device()                          # cuda:local_rank when nccl is in the backend, else cpu
    group = dist.new_group(list(range(n)))          # every rank takes part in creating it
    if dist.get_rank() >= n:
        return None
    out = {"n": n}
    if pingpong_sizes:
        out["pingpong"] = pingpong(pingpong_sizes, iters=iters, group=group)
    out["sendrecv_sizes"] = sorted({4 << 10, size // n // 4 * 4, size})
    out["sendrecv"] = sendrecv(out["sendrecv_sizes"], iters=iters, group=group)
    gamma = torch.tensor([measure_gamma(4 << 20, iters=5)], dtype=torch.float64, device=device)
    dist.all_reduce(gamma, op=dist.ReduceOp.MAX, group=group)
    out["gamma"] = gamma.item()
    for alg in ("ring", "tree"):
        f = ALLREDUCES[alg]
        out[alg] = time_collective(lambda x: f(x, group=group, check=False), size // 4, iters=iters, group=group)

    # one data-parallel step: 64 random examples per rank, MLP 64 -> 256 -> 256 -> 10, SGD,
    # the gradients averaged by one ring all-reduce of the flat gradient vector
    g = torch.Generator().manual_seed(dist.get_rank())
    x, y = torch.randn(64, 64, generator=g).to(device), torch.randint(0, 10, (64,), generator=g).to(device)
    model = mlp((64, 256, 256, 10), seed=0).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    out["grad_bytes"] = sum(p.numel() for p in model.parameters()) * 4

    def step(sync):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        if sync:
            flat = flat_grads(model)                             # (numel,)
            ring_allreduce(flat, group=group, check=False).div_(n)
            at = 0
            for p in model.parameters():
                p.grad.copy_(flat[at:at + p.numel()].view_as(p)); at += p.numel()
        opt.step()
    out["compute"] = time_collective(lambda _: step(False), 0, iters=iters, group=group)
    out["step"] = time_collective(lambda _: step(True), 0, iters=iters, group=group)
    return out
