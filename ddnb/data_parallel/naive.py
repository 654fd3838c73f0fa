"""Naive data parallelism: every rank runs forward and backward on its own shard of the
batch, then, after backward, all-reduces every parameter's gradient, one call per
parameter, and divides by the number of ranks.

Why averaging is right: with N ranks each holding B samples and the loss a mean over the
batch, the gradient of the global batch of N·B samples is

    ∇L_global = 1/(N·B) Σ_r Σ_{i∈r} ∇ℓ_i = 1/N Σ_r ∇L_r            (L_r: rank r's mean loss)

so the average of the ranks' gradients *is* the global-batch gradient, and N ranks
taking the same SGD step from the same weights stay identical (Goyal et al. 2017,
"Accurate, large minibatch SGD", Sec. 2, for the equivalence with one large batch).
This is the "naive solution" of Li et al., "PyTorch Distributed", VLDB 2020, Sec. 3.2.1.
Its cost is the communication: one all-reduce per parameter tensor, each paying the
latency α, all of it after backward (nothing overlaps). `bucketed.py` fixes both.
Taught in `notebooks/06_data_parallelism.ipynb`.

    model = NaiveDataParallel(model)       # broadcasts rank 0's weights, checks replicas
    loss = loss_fn(model(x), y)
    loss.backward()
    model.sync_gradients()                 # p.grad = mean over ranks, for every p
    optimizer.step()
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn

from ddnb._checks import Checks
from ddnb.data_parallel.replicate import check_replicas, replicate
from ddnb.trace import Tracer, get_tracer

TORCH = "torch"  # torch.distributed.all_reduce; the other names are ddnb.collectives.ALLREDUCES


def allreduce_names() -> tuple[str, ...]:
    from ddnb.collectives import ALLREDUCES

    return (TORCH,) + tuple(ALLREDUCES)


def allreduce_fn(name: str, group=None, tracer: Tracer | None = None):
    """The in-place sum all-reduce `name` as fn(tensor): "torch" (torch.distributed, gloo's
    C++ algorithms) or one of ddnb's from-scratch algorithms (ddnb.collectives.ALLREDUCES:
    "ring", "tree", "naive", "halving_doubling"), which record their messages in `tracer`."""
    validate_allreduce(name)
    if name == TORCH:   # torch's own, through the one traced layer (emulated: timed by its ring's messages)
        from ddnb.collectives import traced

        quiet = Tracer(enabled=False)
        return lambda t: traced.all_reduce(t, group, quiet)
    from ddnb.collectives import ALLREDUCES

    fn = ALLREDUCES[name]
    # check=False: every rank reduces the same parameters in the same order by construction
    # (verified once by check_replicas), so the per-call cross-rank check is not needed
    return lambda t: fn(t, op="sum", group=group, tracer=tracer, check=False)


def validate_allreduce(name, check: Checks | None = None) -> None:
    """`name` one of allreduce_names(): added to `check`, else raised."""
    c = check or Checks()
    c.choice("allreduce", name, allreduce_names())
    if check is None:
        c.done()


def grad_norms(params) -> list[float]:
    """‖p.grad‖₂ of each parameter (0.0 where p.grad is None), as plain floats."""
    return [0.0 if p.grad is None else float(p.grad.detach().norm()) for p in params]


class NaiveDataParallel(nn.Module):
    """Wrap `module`; call `sync_gradients()` after every backward.

    allreduce: "torch" or a ddnb.collectives algorithm ("ring", ...), see `allreduce_fn`.
    broadcast: copy rank 0's parameters and buffers at construction (else only check
    that the replicas are equal, raising ReplicaMismatchError if not).
    record_grad_norms: keep each step's per-parameter gradient norms, before and after
    the all-reduce, in `grad_norm_history` (see `ddnb.viz.gradients`).

    A parameter without a gradient (p.grad is None: unused in this step) counts as a
    zero gradient and gets the average of the others' after sync, so every rank makes
    the same calls and none hangs."""

    def __init__(self, module: nn.Module, group=None, allreduce: str = TORCH, tracer: Tracer | None = None,
                 broadcast: bool = True, record_grad_norms: bool = False):
        super().__init__()
        validate_allreduce(allreduce)
        self.module, self.group, self.allreduce = module, group, allreduce
        self.tracer = tracer
        self.world_size = dist.get_world_size(group)
        self.names = [n for n, p in module.named_parameters() if p.requires_grad]
        self.params = [p for p in module.parameters() if p.requires_grad]
        config = {"strategy": "naive", "allreduce": allreduce}
        if broadcast:
            replicate(module, group=group, config=config)
        else:
            check_replicas(module, group, config=config)
        self._allreduce = allreduce_fn(allreduce, group, tracer)
        self.record_grad_norms = record_grad_norms
        self.grad_norm_history: list[dict] = []
        self.step = 0

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @torch.no_grad()
    def sync_gradients(self) -> None:
        """p.grad <- (1/N) Σ_r p.grad_r for every parameter, one all-reduce each, in
        registration order (the same on every rank)."""
        tr = get_tracer(self.tracer)
        before = grad_norms(self.params) if self.record_grad_norms else None
        for name, p in zip(self.names, self.params):
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            start = time.time()
            self._allreduce(p.grad)                       # Σ_r grad_r, in place
            p.grad.div_(self.world_size)                  # the mean: ∇L_global
            tr.record("collective", f"allreduce {name}", start, time.time(),
                      nbytes=p.grad.numel() * p.grad.element_size(), step=self.step, param=name)
        if self.record_grad_norms:
            self.grad_norm_history.append({"step": self.step, "before": before, "after": grad_norms(self.params)})
        self.step += 1
