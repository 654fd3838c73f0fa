"""Checker for the ZeRO chapter (11): the learner's ZeRO-1 step, run on real processes
against one process running torch.optim.SGD (with momentum) on the mean gradient.

The learner writes `fn(flat, grad, state, lr, momentum)`: flat (N·S,) the parameters, the
same on every rank, to update in place; grad (N·S,) this rank's gradient; state a dict the
checker keeps between steps for this rank's optimizer state. ZeRO-1 (Rajbhandari et al.
2020, Sec. 5.1): reduce-scatter the gradients (rank r gets the sum of its slice; divide by
N), step the slice with momentum for the slice only, all-gather the parameters.
Taught in `notebooks/11_memory_sharding.ipynb`; solution in
`ddnb.exercises.solutions.sharding.zero1_step`.
"""
from __future__ import annotations

import torch

from ddnb._checks import Checks
from ddnb.exercises.core import compare, passed, run_on_ranks


def _initial(numel: int) -> torch.Tensor:
    """(numel,) float64 parameters, the same on every rank."""
    return torch.linspace(-1.0, 1.0, numel, dtype=torch.float64)


def _grad(step: int, rank: int, numel: int) -> torch.Tensor:
    """(numel,) float64: rank r's gradient at `step`, different on every rank and step."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(numel, generator=g, dtype=torch.float64)


def _state_numel(state) -> int:
    """Elements of the tensors in `state` (dicts, lists and torch optimizers looked into)."""
    if torch.is_tensor(state):
        return state.numel()
    if isinstance(state, torch.optim.Optimizer):
        return _state_numel(list(state.state.values()))
    if isinstance(state, dict):
        return sum(_state_numel(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(_state_numel(v) for v in state)
    return 0


def _run_zero1(fn, numel, steps, lr, momentum):
    import torch.distributed as dist

    rank = dist.get_rank()
    flat, state = _initial(numel), {}
    for step in range(steps):
        fn(flat, _grad(step, rank, numel), state, lr, momentum)
    return flat, _state_numel(state)


def reference_zero1(world_size: int, numel: int, steps: int, lr: float, momentum: float) -> torch.Tensor:
    """torch.optim.SGD(momentum) on one process, on the mean of every rank's gradient."""
    p = torch.nn.Parameter(_initial(numel))
    opt = torch.optim.SGD([p], lr=lr, momentum=momentum)
    for step in range(steps):
        p.grad = sum(_grad(step, r, numel) for r in range(world_size)) / world_size
        opt.step()
    return p.detach()


def diagnose_zero1(got, expected, start, rank: int, n: int) -> str:
    """What a wrong ZeRO-1 result on `rank` usually means (the hint of check_zero1_step)."""
    S = got.numel() // n
    mine = slice(rank * S, (rank + 1) * S)
    if torch.equal(got, start):
        return "the parameters are unchanged: update `flat` in place (all_gather_single(flat, ...) writes it)"
    if torch.allclose(got - start, n * (expected - start)):
        return (f"every update is off by a factor of N = {n}: the reduce-scatter sums the gradients; "
                f"divide by world_size for the data-parallel mean")
    if torch.allclose(got[mine], expected[mine]) and not torch.allclose(got, expected):
        return (f"rank {rank} holds only its own shard (elements {mine.start}..{mine.stop - 1}) updated: "
                f"did the all-gather run?")
    return "the update differs: check the slice each rank steps (rank r owns flat[r·S:(r+1)·S]) and the momentum"


def check_zero1_step(fn, world_size: int = 4, shard_numel: int = 5, steps: int = 3, lr: float = 0.1,
                     momentum: float = 0.9, timeout: float = 30) -> str:
    """Run `fn(flat, grad, state, lr, momentum)` for `steps` steps on `world_size` real
    processes (flat of world_size·shard_numel float64 elements) and compare every rank's
    parameters with torch.optim.SGD on one process, then check that the optimizer state
    each rank keeps in `state` is its shard only (fewer elements than the whole vector)."""
    with Checks("check_zero1_step") as check:
        check.rule(callable(fn), f"fn={fn!r}: need a function fn(flat, grad, state, lr, momentum)")
        check.integer("world_size", world_size, min=2, max=8)
        check.positive_ints(shard_numel=shard_numel, steps=steps)
        check.number("lr", lr, positive=True)
        check.number("momentum", momentum, min=0, below=1)
    numel = world_size * shard_numel
    results = run_on_ranks(_run_zero1, world_size, fn, numel, steps, lr, momentum,
                           what=getattr(fn, "__name__", "fn"), timeout=timeout)
    expected, start = reference_zero1(world_size, numel, steps, lr, momentum), _initial(numel)
    for rank, (got, _) in enumerate(results):
        hint = "" if torch.allclose(got, expected) else diagnose_zero1(got, expected, start, rank, world_size)
        compare(got, expected, rank=rank, name=f"parameters after {steps} steps", hint=hint, atol=1e-9)
    for rank, (_, kept) in enumerate(results):
        if kept >= numel:
            raise AssertionError(
                f"rank {rank} keeps {kept} elements of optimizer state for {numel} parameters: the optimizer "
                f"state is not sharded (every rank stepped the whole vector). ZeRO-1 keeps the momentum of its own "
                f"shard only, {shard_numel} elements, and steps only flat[r·S:(r+1)·S]")
    return passed("check_zero1_step", f"{world_size} ranks, {steps} steps equal torch.optim.SGD on one process; "
                  f"each rank keeps {results[0][1]} of {numel} elements of optimizer state")
