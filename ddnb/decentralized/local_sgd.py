"""Local SGD (periodic averaging): H local SGD steps on each worker, then one all-reduce of
the parameters (Stich 2019, "Local SGD Converges Fast and Communicates Little", ICLR,
Eq. 2; Lin et al. 2020, "Don't Use Large Mini-Batches, Use Local SGD", ICLR, Alg. 1 and,
with warmup_steps > 0, "post-local SGD": H = 1 for the first steps, then H).

    x_i <- x_i - lr g_i(x_i)                      every step, on every worker alone
    x_i <- (1/N) sum_j x_j                        after every H-th step (and the last one)

With H = 1 and plain SGD this is synchronous all-reduce SGD: averaging x_i - lr g_i gives
x - lr mean_i g_i, the step that `train_allreduce_sgd` (the baseline: average the
gradients, then step) takes. Communication falls by H: per step a worker sends
2(N-1)/N · S / H with a ring all-reduce (`ddnb.collectives.ring_allreduce`, traced).
Taught in `notebooks/05b_decentralized.ipynb`.
"""
from __future__ import annotations

from ddnb.collectives import ALLREDUCES
from ddnb.decentralized.config import DecentralizedConfig
from ddnb.decentralized.worker import Worker


def averages_after(config: DecentralizedConfig) -> list[int]:
    """The steps (1..steps, counted after the step) after which local SGD averages: every
    step of the warm-up, then every H-th step after it, and always the last."""
    out = []
    for t in range(1, config.steps + 1):
        if t <= config.warmup_steps or (t - config.warmup_steps) % config.local_steps == 0 or t == config.steps:
            out.append(t)
    return out


def train_local_sgd(config: DecentralizedConfig, model_fn, dataset, test=None, group=None, tracer=None,
                    loss_fn=None, algorithm: str = "ring") -> dict:
    """Call on every rank: local SGD with H = config.local_steps (after warmup_steps with
    H = 1), averaging with `ddnb.collectives.<algorithm>_allreduce`; `Worker` stats."""
    w = Worker("local_sgd", config, model_fn, dataset, test, group, tracer, loss_fn)
    allreduce, when = ALLREDUCES[algorithm], set(averages_after(config))
    x = w.initial()                                                      # (S,)
    w.measure(0, x)
    for step in range(config.steps):
        _, g = w.gradient(x, step)
        x = x - config.lr * g
        if step + 1 in when:
            allreduce(x, op="avg", group=group, tracer=w.tracer, check=False)
        w.tick()
        w.measure(step + 1, x)
    return w.finish(x)


def train_allreduce_sgd(config: DecentralizedConfig, model_fn, dataset, test=None, group=None, tracer=None,
                        loss_fn=None, algorithm: str = "ring") -> dict:
    """Call on every rank: synchronous SGD, the gradients averaged every step with
    `<algorithm>_allreduce` (the baseline every method here is compared with)."""
    w = Worker("allreduce_sgd", config, model_fn, dataset, test, group, tracer, loss_fn)
    allreduce = ALLREDUCES[algorithm]
    x = w.initial()                                                      # (S,)
    w.measure(0, x)
    for step in range(config.steps):
        _, g = w.gradient(x, step)
        allreduce(g, op="avg", group=group, tracer=w.tracer, check=False)
        x = x - config.lr * g
        w.tick()
        w.measure(step + 1, x)
    return w.finish(x)
