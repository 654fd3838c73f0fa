"""Checker for the ZeRO chapter (11): the learner's ZeRO-1 step, run on real processes
against one process running torch.optim.SGD (with momentum) on the mean gradient.

The learner writes `fn(flat, grad, state, lr, momentum)`: flat (N·S,) the parameters, the
same on every rank, to update in place; grad (N·S,) this rank's gradient; state a dict the
checker keeps between steps for this rank's optimizer state. ZeRO-1 (Rajbhandari et al.
2020, Sec. 5.1): reduce-scatter the gradients (rank r gets the sum of its slice; divide by
N), step the slice with momentum for the slice only, all-gather the parameters. The
checker builds the learner's function afresh for every step and keeps `state` on the
rank in between, so momentum kept anywhere else (a global, a closure) is lost and named:
the state must be sharded, and must be in `state` (`ddnb.exercises.guard`).
Taught in `notebooks/11_memory_sharding.ipynb`; solution in
`ddnb.exercises.solutions.sharding.zero1_step`.
"""
from __future__ import annotations

import uuid

import torch

from ddnb._checks import Checks
from ddnb.exercises import worlds
from ddnb.exercises.core import compare, passed, run_on_ranks
from ddnb.exercises.guard import ship


def _initial(numel: int) -> torch.Tensor:
    """(numel,) float64 parameters, the same on every rank."""
    return torch.linspace(-1.0, 1.0, numel, dtype=torch.float64)


def _grad(step: int, rank: int, numel: int) -> torch.Tensor:
    """(numel,) float64: rank r's gradient at `step`, different on every rank and step."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(numel, generator=g, dtype=torch.float64)


def _optimizers(obj) -> list:
    if isinstance(obj, torch.optim.Optimizer):
        return [obj]
    values = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()
    return [o for v in values for o in _optimizers(v)]


def _state_numel(state, skip=None) -> int:
    """Elements of optimizer state in `state`: its tensors (dicts, lists and torch
    optimizers looked into), not counting the parameters an optimizer in it steps (a
    copy of the shard's parameters is not optimizer state)."""
    if skip is None:
        skip = {id(p) for opt in _optimizers(state) for group in opt.param_groups for p in group["params"]}
    if torch.is_tensor(state):
        return 0 if id(state) in skip else state.numel()
    if isinstance(state, torch.optim.Optimizer):
        return _state_numel(list(state.state.values()), skip)
    if isinstance(state, dict):
        return sum(_state_numel(v, skip) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(_state_numel(v, skip) for v in state)
    return 0


_ON_RANK: dict = {}     # on a rank: run id -> (flat, state), kept between the steps of one check


def _run_zero1_step(blob, run: str, step: int, numel: int, lr: float, momentum: float, last: bool):
    """On a rank: one step of the learner's function, built afresh from `blob` (a global
    or a closure of it starts as it was shipped: only `state` carries over). Returns
    (flat after the last step, else None; {where: elements} it kept outside `state`
    during this step; elements of optimizer state in `state`)."""
    import torch.distributed as dist

    from ddnb.exercises.guard import held_outside, land

    if step == 0:
        _ON_RANK.clear()                         # a check that failed midway leaves its entry
        _ON_RANK[run] = (_initial(numel), {})
    flat, state = _ON_RANK[run]
    fn = land(blob)
    before = held_outside(fn)
    fn(flat, _grad(step, dist.get_rank(), numel), state, lr, momentum)
    after = held_outside(fn)
    outside = {where: elements for where, (elements, total) in after.items()
               if elements and (elements, total) != before.get(where)}
    if last:
        del _ON_RANK[run]
    return (flat if last else None), outside, _state_numel(state)


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


def check_zero1_step(fn, world_size: int | None = None, shard_numel: int = 5, steps: int = 3, lr: float = 0.1,
                     momentum: float = 0.9, timeout: float = 30, world_sizes=(4, 3)) -> str:
    """Run `fn(flat, grad, state, lr, momentum)` for `steps` steps on real processes (flat
    of N·shard_numel float64 elements), on two world sizes (`world_sizes`, or `world_size`
    and a second one, `ddnb.exercises.worlds`), and compare every rank's parameters with
    torch.optim.SGD on one process. Each step is a separate run of a freshly built fn
    (`ddnb.exercises.guard.land`): only `state`, kept on the rank, carries over, and a
    tensor fn keeps in a global, a closure or a default argument is refused, naming the
    rank and the name. `state` must hold exactly this rank's shard of optimizer state,
    S = shard_numel elements of momentum (at most S with momentum 0; an optimizer's own
    parameters are not counted): ZeRO-1 (Rajbhandari et al. 2020, Sec. 5.1)."""
    with Checks("check_zero1_step") as check:
        check.rule(callable(fn), f"fn={fn!r}: need a function fn(flat, grad, state, lr, momentum)")
        ns = worlds.world_sizes(check, world_size, world_sizes, min_world=2)
        check.positive_ints(shard_numel=shard_numel, steps=steps)
        check.number("lr", lr, positive=True)
        check.number("momentum", momentum, min=0, below=1)
    blob, S = ship(fn), shard_numel
    for n in ns:
        numel, run = n * S, uuid.uuid4().hex
        for step in range(steps):
            results = run_on_ranks(_run_zero1_step, n, blob, run, step, numel, lr, momentum, step == steps - 1,
                                   what=getattr(fn, "__name__", "fn"), timeout=timeout)
            for rank, (_, outside, _) in enumerate(results):
                if outside:
                    kept = ", ".join(f"{e} element(s) in {where}" for where, e in outside.items())
                    raise AssertionError(
                        f"{n} ranks, step {step}: rank {rank} keeps {kept}, outside `state`. The checker builds "
                        f"your function afresh for every step, so only `state` carries over (as only the "
                        f"optimizer's state does in a real run): keep this rank's momentum, {S} elements, in `state`")
        expected, start = reference_zero1(n, numel, steps, lr, momentum), _initial(numel)
        for rank, (got, _, _) in enumerate(results):
            hint = "" if torch.allclose(got, expected) else diagnose_zero1(got, expected, start, rank, n)
            compare(got, expected, rank=rank, name=f"{n} ranks: parameters after {steps} steps", hint=hint,
                    atol=1e-9)
        for rank, (_, _, kept) in enumerate(results):
            if kept >= numel and kept > S:
                raise AssertionError(
                    f"rank {rank} of {n} keeps {kept} elements of optimizer state for {numel} parameters: the "
                    f"optimizer state is not sharded (every rank stepped the whole vector). ZeRO-1 keeps the momentum "
                    f"of its own shard only, {S} elements, and steps only flat[r·S:(r+1)·S]")
            if kept > S or (kept < S and momentum > 0):
                raise AssertionError(
                    f"rank {rank} of {n} keeps {kept} elements of optimizer state in `state`; ZeRO-1 keeps exactly "
                    f"its shard's momentum, S = {S} elements ({numel} parameters / {n} ranks)")
    return passed("check_zero1_step", f"{worlds.in_words(ns)}, {steps} steps equal torch.optim.SGD on one process; "
                  f"each rank keeps its shard's {S} elements of optimizer state, nothing outside `state`")
