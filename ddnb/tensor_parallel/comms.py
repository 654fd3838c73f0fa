"""The communication of tensor parallelism: four autograd functions, each the conjugate of
another (what one does in forward, its partner does in backward).

Megatron-LM (Shoeybi et al. 2019, "Megatron-LM: Training Multi-Billion Parameter Language
Models Using Model Parallelism", arXiv 1909.08053, Sec. 3 and Fig. 3) splits a transformer
layer's matmuls across the t ranks of a tensor-parallel group and needs only two operators
to keep forward and backward right:

    f   copy_to_tp        forward: identity        backward: all-reduce (sum)
    g   reduce_from_tp    forward: all-reduce      backward: identity

`f` sits where a replicated activation X enters a column-split matmul: every rank uses
the same X, so ∂L/∂X is the sum of every rank's contribution (the all-reduce). `g` sits
where the row-split matmul's partial outputs Y_r leave: Y = Σ_r Y_r, and ∂L/∂Y_r = ∂L/∂Y
on every rank (identity). Two more move a tensor between "split along the last dim" and
"replicated":

    gather_from_tp    forward: all-gather (last dim)   backward: keep my slice
    scatter_to_tp     forward: keep my slice           backward: all-gather (last dim)

Each takes an explicit `group` (None: the default group) and records one "collective"
event in a `ddnb.trace.Tracer` per call that communicates, with the op ("all_reduce",
"all_gather"), the phase ("forward", "backward") and the bytes, so that
`count_collectives(events)` counts a layer's communication from its trace. A group of
one rank communicates nothing and records nothing. Taught in
`notebooks/10_tensor_parallelism.ipynb`.
"""
from __future__ import annotations

from collections import Counter

import torch
import torch.distributed as dist

from ddnb.collectives import traced
from ddnb.trace import Tracer


def tp_size(group=None) -> int:
    return dist.get_world_size(group)


def tp_rank(group=None) -> int:
    return dist.get_rank(group)


def all_reduce(t: torch.Tensor, group=None, tracer: Tracer | None = None, phase: str = "forward",
               name: str = "", op=dist.ReduceOp.SUM) -> torch.Tensor:
    """Traced in-place all-reduce of `t` over `group` (a no-op on a group of one)."""
    if tp_size(group) == 1:
        return t
    return traced.all_reduce(t, group, tracer, f"all_reduce {name} {phase}".replace("  ", " "), op=op, phase=phase,
                             reduce="max" if op == dist.ReduceOp.MAX else "sum")


def all_gather_last(t: torch.Tensor, group=None, tracer: Tracer | None = None, phase: str = "forward",
                    name: str = "") -> torch.Tensor:
    """(..., n) on each of t ranks -> (..., t·n), rank 0's slice first."""
    size = tp_size(group)
    if size == 1:
        return t
    parts = traced.all_gather(t, group, tracer, f"all_gather {name} {phase}".replace("  ", " "), phase=phase)
    return torch.cat(list(parts.unbind(0)), dim=-1)


def split_last(t: torch.Tensor, group=None) -> torch.Tensor:
    """(..., t·n) -> this rank's (..., n) slice (no communication)."""
    size = tp_size(group)
    if size == 1:
        return t
    n = t.shape[-1]
    if n % size:
        raise ValueError(f"last dim {n} is not divisible by the tensor-parallel size {size}")
    return t.narrow(-1, tp_rank(group) * (n // size), n // size).contiguous()


class _CopyToTP(torch.autograd.Function):
    """This is the `f` function in the paper (Shoeybi et al. 2019, Sec. 3, Fig. 3a and 3b)."""

    @staticmethod
    def forward(ctx, x, group, tracer, name):
        ctx.group, ctx.tracer, ctx.name = group, tracer, name
        return x.view_as(x)                                   # identity

    @staticmethod
    def backward(ctx, grad):
        return all_reduce(grad.contiguous().clone(), ctx.group, ctx.tracer, "backward", ctx.name), None, None, None


class _ReduceFromTP(torch.autograd.Function):
    """This is the `g` function in the paper (Shoeybi et al. 2019, Sec. 3, Fig. 3a and 3b)."""

    @staticmethod
    def forward(ctx, x, group, tracer, name):
        return all_reduce(x.contiguous().clone(), group, tracer, "forward", name)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None, None                         # identity


class _GatherFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, tracer, name):
        ctx.group = group
        return all_gather_last(x, group, tracer, "forward", name)

    @staticmethod
    def backward(ctx, grad):
        return split_last(grad, ctx.group), None, None, None


class _ScatterToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, tracer, name):
        ctx.group, ctx.tracer, ctx.name = group, tracer, name
        return split_last(x, group)

    @staticmethod
    def backward(ctx, grad):
        return all_gather_last(grad, ctx.group, ctx.tracer, "backward", ctx.name), None, None, None


def copy_to_tp(x, group=None, tracer: Tracer | None = None, name: str = "f"):
    """f: identity forward, all-reduce of the gradient backward."""
    return _CopyToTP.apply(x, group, tracer, name)


def reduce_from_tp(x, group=None, tracer: Tracer | None = None, name: str = "g"):
    """g: all-reduce (sum) forward, identity backward."""
    return _ReduceFromTP.apply(x, group, tracer, name)


def gather_from_tp(x, group=None, tracer: Tracer | None = None, name: str = "gather"):
    """(..., n) shards -> (..., t·n) on every rank; backward keeps this rank's slice."""
    return _GatherFromTP.apply(x, group, tracer, name)


def scatter_to_tp(x, group=None, tracer: Tracer | None = None, name: str = "scatter"):
    """(..., t·n) replicated -> this rank's (..., n); backward all-gathers the gradient."""
    return _ScatterToTP.apply(x, group, tracer, name)


def count_collectives(events: list[dict]) -> dict[tuple[str, str], int]:
    """{(op, phase): number of calls} over the "collective" events that carry an op,
    e.g. {("all_reduce", "forward"): 2, ("all_reduce", "backward"): 2} for one layer."""
    return dict(Counter((e["op"], e["phase"]) for e in events if e["kind"] == "collective" and "op" in e))
