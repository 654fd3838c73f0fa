"""Checker for DiLoCo's outer step (chapter 16): the learner's outer step run on real
processes, each rank holding its own local parameters after H inner steps, against
torch.optim.SGD(nesterov=True) applied in one process to the outer gradient

    Delta = theta - (1/N) sum_i theta_i            (Douillard et al. 2023, Algorithm 1)

for two outer steps in a row (the second one reads the momentum the first one left). The
ranks may all-reduce (that is how the deltas are averaged); ddnb's own outer step
(`ddnb.decentralized.diloco.outer_step`, `nesterov_step`) is refused, by name in the
learner's code and on the ranks while it runs (`ddnb.exercises.guard`).
Taught in `notebooks/16b_slow_link.ipynb`.

    check_outer_step(my_outer_step)   # my_outer_step(local_params, global_params, momentum_buffers, lr, momentum)
"""
from __future__ import annotations

import torch

from ddnb._checks import Checks
from ddnb.exercises.core import compare, passed, run_on_ranks, used_name
from ddnb.exercises.guard import LIBRARY, ship

SHAPES = ((5,), (2, 3))
SHORTCUT = ("ddnb.decentralized.diloco.outer_step", "ddnb.decentralized.diloco.nesterov_step")
WHY = "write the outer step yourself: average the deltas with dist.all_reduce, then the Nesterov update"


def _start(rank: int, outer: int) -> tuple[list, list]:
    """(this rank's local parameters after the inner steps of outer step `outer`, the
    global parameters at the very start), float32 tensors of SHAPES."""
    g = torch.Generator().manual_seed(7)
    theta = [torch.randn(s, generator=g) for s in SHAPES]
    h = torch.Generator().manual_seed(100 * outer + rank)
    return [0.1 * torch.randn(s, generator=h) for s in SHAPES], theta


def reference(n: int, lr: float, momentum: float, outer_steps: int = 2) -> list[tuple[list, list]]:
    """[(global params, momentum buffers)] after each outer step, by torch.optim.SGD(nesterov=True)
    on the outer gradient theta - mean_i theta_i (theta_i = theta + rank i's drift)."""
    theta = [p.clone().requires_grad_(False) for p in _start(0, 0)[1]]
    params = [torch.nn.Parameter(p.clone()) for p in theta]
    opt = torch.optim.SGD(params, lr=lr, momentum=momentum, nesterov=True)
    out = []
    for k in range(outer_steps):
        drifts = [_start(r, k)[0] for r in range(n)]
        for j, p in enumerate(params):
            local_mean = torch.stack([p.detach() + drifts[r][j] for r in range(n)]).mean(0)
            p.grad = p.detach() - local_mean
        opt.step()
        out.append(([p.detach().clone() for p in params], [opt.state[p]["momentum_buffer"].clone() for p in params]))
    return out


def _run(blob, lr: float, momentum: float, outer_steps: int):
    import torch.distributed as dist

    from ddnb.exercises.guard import land, refuse_collectives

    rank = dist.get_rank()
    theta = _start(rank, 0)[1]
    buffers = [torch.zeros_like(p) for p in theta]
    got = []
    with refuse_collectives(allow=("all_reduce",), why=WHY, library=LIBRARY + SHORTCUT):
        fn = land(blob)
        for k in range(outer_steps):
            local = [p + d for p, d in zip(theta, _start(rank, k)[0])]      # theta_i after H inner steps
            out = fn(local, [p.clone() for p in theta], buffers, lr, momentum)
            theta = [t.detach().clone() for t in out]
            got.append((theta, [b.detach().clone() for b in buffers]))
    return got


def check_outer_step(fn, world_size: int = 3, lr: float = 0.7, momentum: float = 0.9, outer_steps: int = 2,
                     timeout: float = 30) -> str:
    """Run `fn(local_params, global_params, momentum_buffers, lr, momentum)` on `world_size`
    real processes, `outer_steps` times: local_params are this rank's tensors after its inner
    steps (every rank's differ), global_params the tensors all ranks share, momentum_buffers
    (zeros at first) kept between calls. fn must return the new global parameters and update
    momentum_buffers in place; both are compared with torch.optim.SGD(nesterov=True) on the
    averaged outer gradient, within 1e-6, on every rank."""
    with Checks("check_outer_step") as check:
        check.rule(callable(fn), f"fn={fn!r}: need fn(local_params, global_params, momentum_buffers, lr, momentum)")
        check.integer("world_size", world_size, min=2, max=8)
        check.integer("outer_steps", outer_steps, min=1)
        check.number("lr", lr, positive=True)
        check.number("momentum", momentum, positive=True, below=1)
    hit = used_name(fn, ("outer_step", "nesterov_step"))
    if hit is not None:
        raise AssertionError(f"{getattr(fn, '__name__', 'fn')} calls {hit}: ddnb's outer step is the answer, "
                             f"not the exercise; {WHY}")
    got = run_on_ranks(_run, world_size, ship(fn), lr, momentum, outer_steps, what=getattr(fn, "__name__", "fn"),
                       timeout=timeout)
    ref = reference(world_size, lr, momentum, outer_steps)
    for k, (theta, bufs) in enumerate(ref):
        for rank, steps in enumerate(got):
            g_theta, g_bufs = steps[k]
            for j in range(len(SHAPES)):
                hint = ("the outer gradient is global - mean(local): all-reduce the deltas (sum), divide by the "
                        "world size; Nesterov: b = m b + g, then theta -= lr (g + m b)")
                compare(g_theta[j], theta[j], rank=rank, name=f"outer step {k + 1}, global tensor {j}", hint=hint,
                        atol=1e-6)
                compare(g_bufs[j], bufs[j], rank=rank, name=f"outer step {k + 1}, momentum buffer {j}",
                        hint="update momentum_buffers in place (b.mul_(m).add_(g)): the next outer step reads it",
                        atol=1e-6)
    return passed("check_outer_step", f"every rank's global parameters and momentum equal torch's Nesterov SGD on "
                                      f"the averaged delta, {outer_steps} outer steps on {world_size} processes")
