"""EASGD: elastic averaging SGD, every worker pulled toward a center variable x~ held by
rank 0, which is pulled toward the workers in turn (Zhang, Choromanska & LeCun 2015,
"Deep learning with Elastic Averaging SGD", NeurIPS, Eq. 5-6, synchronous, with the
communication period tau of Sec. 3, Algorithm 1):

    at steps t with t mod tau = 0:
        d_i = alpha (x_i - x~)                     the elastic difference, at x_i before the step
        x_i <- x_i - lr g_i(x_i) - d_i             every worker
        x~  <- x~ + sum_i d_i                      rank 0: the center moves toward the workers
    other steps: x_i <- x_i - lr g_i(x_i)          (tau = config.local_steps)

alpha = beta / N with beta = 0.9 by default (the paper's beta, Sec. 5); N alpha <= 1 keeps
x~ an average. Rank 0 is a worker *and* holds the center (no extra server rank): on a
communication step every other rank sends x_i to rank 0 and receives x~ from it, posted
before the gradient and completed after it, so the messages overlap the compute. Bytes per
communication: a worker S each way, rank 0 (N-1)·S each way (the central server's
bottleneck of notebook 04, every tau steps). With one worker EASGD is not SGD: x is pulled
back toward x~, which lags it (alpha -> 0 gives SGD). The model is the center.
Taught in `notebooks/05b_decentralized.ipynb`.
"""
from __future__ import annotations

import torch

from ddnb.collectives import p2p
from ddnb.decentralized.config import DecentralizedConfig
from ddnb.decentralized.worker import Worker


def train_easgd(config: DecentralizedConfig, model_fn, dataset, test=None, group=None, tracer=None,
                loss_fn=None) -> dict:
    """Call on every rank: synchronous EASGD with period tau = config.local_steps and
    alpha = config.elastic(N); `Worker` stats, plus "center" (x~, (S,)) on rank 0."""
    w = Worker("easgd", config, model_fn, dataset, test, group, tracer, loss_fn)
    n, me, lr, alpha, tau = w.n, w.rank, config.lr, config.elastic(w.n), config.local_steps
    x = w.initial()                                                      # (S,)
    center = x.clone()                                                   # (S,) x~, used on rank 0
    w.measure(0, x)
    for step in range(config.steps):
        talk = step % tau == 0
        posted, got = [], {}
        if talk and n > 1:
            if me == 0:
                got = {j: torch.empty_like(x) for j in range(1, n)}      # j -> x_j (S,)
                ops = [p2p.Op("send", center, j, name="center") for j in range(1, n)]
                ops += [p2p.Op("recv", buf, j, name="worker") for j, buf in got.items()]
            else:
                ops = [p2p.Op("send", x, 0, name="worker"), p2p.Op("recv", center, 0, name="center")]
            posted = p2p.post(ops, group, w.tracer)
        _, g = w.gradient(x, step)
        for p in posted:
            p.wait()
        if talk:
            diff = alpha * (x - center)                                  # (S,) d_i
            if me == 0:
                total = diff
                for j in sorted(got):
                    total = total + alpha * (got[j] - center)
                center = center + total
            x = x - lr * g - diff
        else:
            x = x - lr * g
        w.tick()
        w.measure(step + 1, x)
    stats = w.finish(x)
    if me == 0:
        stats["center"] = center
    return stats


def communications(config: DecentralizedConfig) -> int:
    """How many steps of `config.steps` exchange with the center: those with t mod tau = 0."""
    return len(range(0, config.steps, config.local_steps))
