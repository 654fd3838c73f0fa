"""Checker for the parameter-server chapter (04): the learner's synchronous (BSP) step,
pull / compute / push on the workers and the server's apply, run for a few steps on real
processes and compared with `ddnb.parameter_server.train` (mode "bsp", one server) run on
the same processes, data and model (Li et al. 2014, OSDI, Sec. 3.1, Algorithm 1).
Taught in `notebooks/04_parameter_server.ipynb`.

    def ps_step(params, compute_grad, lr):   # rank 0 the server, ranks 1..N-1 the workers
        ...                                   # pull, compute_grad(params), push; apply on rank 0
    check_ps_step(ps_step, world_size=3)
"""
from __future__ import annotations

from functools import partial

import torch

from ddnb._checks import Checks
from ddnb.exercises.core import passed, run_on_ranks

SIZES, BATCH, SEED = (8, 6, 3), 4, 0      # a tiny MLP (75 parameters), 4 examples per worker and step


def _dataset():
    """A fixed synthetic classification set: x (96, 8), y (96,) in 0..2."""
    from ddnb.data import Dataset

    g = torch.Generator().manual_seed(SEED)
    return Dataset(torch.randn(96, SIZES[0], generator=g), torch.randint(0, SIZES[-1], (96,), generator=g))


def _model_fn():
    from ddnb.models import mlp

    return partial(mlp, SIZES, seed=SEED)


def _grad_fn(model, worker: int, workers: int, step: int):
    """compute_grad(params) of worker number `worker` at `step`: the gradient (S,) of its batch."""
    import torch.nn.functional as F

    from ddnb.parameter_server import worker_batch
    from ddnb.parameter_server.worker import forward_backward

    x, y = worker_batch(_dataset(), worker, workers, BATCH, step, SEED)       # (B, 8), (B,)
    return lambda params: forward_backward(model, params.clone(), x, y, F.cross_entropy)[1]


def _run_learner(fn, steps: int, lr: float):
    import torch.distributed as dist

    from ddnb.models import flat_params

    rank, n = dist.get_rank(), dist.get_world_size()
    model = _model_fn()()
    params = flat_params(model)                                               # (S,) server: the initial ones
    for step in range(steps):
        grad = None if rank == 0 else _grad_fn(model, rank - 1, n - 1, step)
        fn(params, grad, lr)
    return params


def _run_ddnb(steps: int, lr: float):
    from ddnb.parameter_server import PSConfig, train

    config = PSConfig(servers=1, mode="bsp", steps=steps, batch_size=BATCH, lr=lr, momentum=0.0, seed=SEED)
    return train(config, _model_fn(), _dataset())


def _simulate(workers: int, steps: int, lr: float, how: str) -> torch.Tensor:
    """One process's version of `steps` server updates, right ("mean") or wrong in a known way."""
    from ddnb.models import flat_params

    model = _model_fn()()
    params = initial = flat_params(model)
    for step in range(steps):
        at = initial if how == "no pull" else params
        grads = torch.stack([_grad_fn(model, w, workers, step)(at) for w in range(workers)])   # (N, S)
        update = {"mean": grads.mean(0), "sum": grads.sum(0), "no pull": grads.mean(0), "last": grads[-1],
                  "none": torch.zeros_like(params)}[how]
        params = params - lr * update
    return params


HINTS = {
    "sum": "the server applied the sum of the workers' gradients: BSP applies their mean (divide by N - 1 workers)",
    "no pull": ("the workers computed every gradient at the initial parameters: pull (receive the server's current "
                "parameters into `params`) before compute_grad"),
    "last": "the server applied one worker's gradient: receive one from every worker, then apply their mean",
    "none": ("the server's parameters never changed: apply the update to `params` in place (params -= lr * ...); "
             "a new tensor is not seen by the caller"),
}


def check_ps_step(fn, world_size: int = 3, steps: int = 3, lr: float = 0.5, timeout: float = 30) -> str:
    """Run `fn(params, compute_grad, lr)` `steps` times on `world_size` real processes
    (rank 0 the server, compute_grad None there; ranks 1.. the workers) and compare the
    server's parameters with those of `ddnb.parameter_server.train` (BSP, one server, no
    momentum) on the same processes. Returns the success line; else AssertionError naming
    the element and what the difference usually means, or when fn hangs or raises."""
    with Checks("check_ps_step") as check:
        check.rule(callable(fn), f"fn={fn!r}: need a function fn(params, compute_grad, lr)")
        check.integer("world_size", world_size, min=2, max=8)
        check.integer("steps", steps, min=1, max=20)
        check.number("lr", lr, positive=True)
    from ddnb.parameter_server import final_params

    got = run_on_ranks(_run_learner, world_size, fn, steps, lr, what=getattr(fn, "__name__", "fn"),
                       timeout=timeout)[0]
    reference = final_params(run_on_ranks(_run_ddnb, world_size, steps, lr, what="ddnb's train", timeout=timeout))
    if not isinstance(got, torch.Tensor) or got.shape != reference.shape:
        raise AssertionError(f"the server's params: expected a tensor of shape {tuple(reference.shape)}, got {got!r}")
    bad = ~torch.isclose(got, reference, rtol=1e-5, atol=1e-6)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        hint = next((h for how, h in HINTS.items()
                     if torch.allclose(got, _simulate(world_size - 1, steps, lr, how), rtol=1e-5, atol=1e-6)),
                    "pull the parameters, compute the gradient, push it; the server averages all N - 1 and "
                    "applies params -= lr * mean")
        raise AssertionError(f"the server's (rank 0) parameters after {steps} steps, element {i}: ddnb's "
                             f"parameter server has {reference[i].item():.6g}, yours {got[i].item():.6g}. {hint}")
    return passed("check_ps_step", f"the server's parameters equal ddnb.parameter_server's (BSP) after {steps} steps "
                                   f"with {world_size - 1} workers")
