"""Checker for the decentralized chapter's loop (05b): the learner's D-PSGD, adapt then
combine, run on real processes against the matrix iteration it must equal,

    X_{t+1} = W (X_t - lr G(X_t))        (Lian et al. 2017, Alg. 1; Koloskova et al. 2020, Alg. 1)

with X (N, S) the ranks' parameters, one row per rank, and G(X) each row's own gradient.
Each rank's objective is a quadratic of its own, f_i(x) = 1/2 sum_k a_ik (x_k - b_ik)^2,
so the gradient a_i * (x - b_i) is exact and the ranks disagree until they gossip.
Taught in `notebooks/05b_decentralized.ipynb`.

    check_dpsgd(my_dpsgd)        # my_dpsgd(x, grad, W, lr, steps) -> this rank's x after `steps`
"""
from __future__ import annotations

import functools

import torch

from ddnb._checks import Checks
from ddnb.exercises.core import compare, passed, run_on_ranks


def quadratic(rank: int, numel: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(a, b), each (numel,) float64: rank `rank`'s curvature (0.5..1.5) and minimum."""
    g = torch.Generator().manual_seed(1000 + rank)
    return 0.5 + torch.rand(numel, generator=g, dtype=torch.float64), torch.randn(numel, generator=g,
                                                                                   dtype=torch.float64)


def gradient(x: torch.Tensor, rank: int) -> torch.Tensor:
    """The gradient of rank `rank`'s quadratic at x: a * (x - b)."""
    a, b = quadratic(rank, x.numel())
    return a * (x - b)


def start(rank: int, numel: int) -> torch.Tensor:
    """(numel,) float64: every rank starts somewhere else."""
    return torch.arange(numel, dtype=torch.float64) / numel + rank


def reference(W: torch.Tensor, numel: int, lr: float, steps: int, order: str = "atc") -> torch.Tensor:
    """(N, numel): the ranks' parameters after `steps` of X <- W (X - lr G(X)) ("atc",
    adapt then combine) or X <- W X - lr G(X) ("lian"), in one process."""
    n, W = W.shape[0], W.double()
    X = torch.stack([start(r, numel) for r in range(n)])                         # (N, S)
    for _ in range(steps):
        G = torch.stack([gradient(X[r], r) for r in range(n)])                   # (N, S)
        X = W @ (X - lr * G) if order == "atc" else W @ X - lr * G
    return X


def _run(fn, name: str, numel: int, lr: float, steps: int):
    import torch.distributed as dist

    from ddnb.decentralized import topology

    rank = dist.get_rank()
    W = topology(name, dist.get_world_size()).W.double()
    return fn(start(rank, numel), functools.partial(gradient, rank=rank), W, lr, steps)


def diagnose(got, W, lr, steps, rank) -> str:
    """What a wrong D-PSGD result usually means."""
    numel = got.numel()
    if torch.allclose(got, start(rank, numel)):
        return f"rank {rank} returned its starting x: run `steps` steps and return the last x"
    if torch.allclose(got, reference(W, numel, lr, 1)[rank]):
        return f"rank {rank} holds the result of one step: loop `steps` times, feeding each step's x into the next"
    if torch.allclose(got, reference(W, numel, lr, steps, order="lian")[rank]):
        return "that is W x - lr g (mix, then the gradient step): this exercise adapts first, then combines, W (x - lr g)"
    return "each step: g = grad(x) at your own x, then x = gossip_step(x - lr * g, W)"


def check_dpsgd(fn, world_size: int = 4, topologies=("ring", "exponential"), numel: int = 5, lr: float = 0.3,
                steps: int = 3, timeout: float = 30) -> str:
    """Run `fn(x, grad, W, lr, steps)` on `world_size` real processes for each topology: x
    is this rank's (numel,) float64 start, grad(x) its gradient, W the (N, N) mixing
    matrix. Each rank must return its row of the matrix iteration X <- W (X - lr G(X))
    after `steps` steps (1e-9). Returns the success line, else AssertionError naming the
    rank and element, with a hint."""
    with Checks("check_dpsgd") as check:
        check.rule(callable(fn), f"fn={fn!r}: need a function fn(x, grad, W, lr, steps) returning x")
        check.integer("world_size", world_size, min=2, max=8)
        check.integer("numel", numel, min=1)
        check.integer("steps", steps, min=1)
    from ddnb.decentralized import topology

    for name in topologies:
        got = run_on_ranks(_run, world_size, fn, name, numel, lr, steps, what=getattr(fn, "__name__", "fn"),
                           timeout=timeout)
        W = topology(name, world_size).W.double()
        ref = reference(W, numel, lr, steps)
        for rank, g in enumerate(got):
            comparable = isinstance(g, torch.Tensor) and g.shape == ref[rank].shape
            hint = diagnose(g.double(), W, lr, steps, rank) if comparable and not torch.allclose(g.double(), ref[rank]) \
                else ""
            compare(g, ref[rank], rank=rank, name=f"D-PSGD on the {name}, {steps} steps", hint=hint, atol=1e-9)
    return passed("check_dpsgd", f"every rank equals W (X - lr G(X)) iterated {steps} times on {world_size} "
                                 f"processes, topologies {list(topologies)}")
