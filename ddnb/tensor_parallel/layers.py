"""Column- and row-parallel linear layers (Shoeybi et al. 2019, arXiv 1909.08053, Sec. 3).

A linear layer Y = X Aᵀ + b with A of shape (out, in) can be split across the t ranks of a
tensor-parallel group in two ways:

    column parallel   A = [A_0; A_1; ...] split by output features (rows of A, the
                      "columns" of the paper's XA): rank r computes Y_r = X A_rᵀ + b_r, its
                      slice of the output features. X must be the same on every rank (f
                      before the matmul: its gradient is all-reduced in backward).
    row parallel      A = [A_0, A_1, ...] split by input features: rank r holds the slice
                      X_r of the input's features and computes the partial Y_r = X_r A_rᵀ;
                      Y = Σ_r Y_r + b (g after the matmul: one all-reduce in forward).

So RowParallelLinear(act(ColumnParallelLinear(X))) is an MLP whose element-wise `act`
needs no communication (the paper's Eq. 3: GeLU(X A_r) is computed independently) and
which all-reduces once in forward (g) and once in backward (f): Fig. 3a.

    col = ColumnParallelLinear.from_linear(fc, group)       # output: this rank's shard
    row = RowParallelLinear.from_linear(proj, group)        # input: a shard, output: the sum
    y = row(F.gelu(col(x)))                                  # == proj(gelu(fc(x)))

`gather_output=True` makes the column layer return the full output (an all-gather);
`input_is_parallel=False` makes the row layer take the full input and keep its slice.
Weights are created the way Megatron does on CPU (`_initialize_affine_weight_cpu`): the
full ("master") weight from a seed, identical on every rank, then this rank's block kept,
so a tensor-parallel layer equals the unsharded one built from the same seed. Taught in
`notebooks/10_tensor_parallelism.ipynb`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ddnb.tensor_parallel.comms import (copy_to_tp, gather_from_tp, reduce_from_tp, scatter_to_tp, tp_rank,
                                        tp_size)
from ddnb.trace import Tracer


def check_divisible(what: str, value: int, size: int, rule: str = "") -> None:
    """ValueError naming the value and the tensor-parallel size when value % size != 0,
    raised before any communication."""
    if value % size:
        raise ValueError(f"{what}={value} is not divisible by the tensor-parallel size tp={size} "
                         f"({value} % {size} = {value % size}){rule}")


def _master_linear(in_features: int, out_features: int, bias: bool, seed: int) -> nn.Linear:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Linear(in_features, out_features, bias=bias)


class ColumnParallelLinear(nn.Module):
    """Y_r = X A_rᵀ + b_r, with A_r the r-th block of out_features/t rows of A.

    Input (..., in) replicated on the group; output (..., out/t), or (..., out) with
    gather_output=True. weight: (out/t, in), bias: (out/t,)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, group=None,
                 gather_output: bool = False, tracer: Tracer | None = None, seed: int = 0,
                 _master: nn.Linear | None = None):
        super().__init__()
        size = tp_size(group)
        check_divisible("out_features", out_features, size, " (a column-parallel layer splits its outputs)")
        self.in_features, self.out_features = in_features, out_features
        self.group, self.gather_output, self.tracer = group, gather_output, tracer
        self.tp, self.tp_rank = size, tp_rank(group)
        master = _master if _master is not None else _master_linear(in_features, out_features, bias, seed)
        n = out_features // size
        rows = slice(self.tp_rank * n, (self.tp_rank + 1) * n)
        self.weight = nn.Parameter(master.weight.detach()[rows].clone())                   # (out/t, in)
        self.bias = None if master.bias is None else nn.Parameter(master.bias.detach()[rows].clone())

    @classmethod
    def from_linear(cls, linear: nn.Linear, group=None, gather_output: bool = False,
                    tracer: Tracer | None = None) -> "ColumnParallelLinear":
        """This rank's shard of an existing nn.Linear (the same on every rank)."""
        return cls(linear.in_features, linear.out_features, linear.bias is not None, group=group,
                   gather_output=gather_output, tracer=tracer, _master=linear)

    def forward(self, x):                                    # (..., in)
        x = copy_to_tp(x, self.group, self.tracer)           # f: all-reduce ∂L/∂x in backward
        y = F.linear(x, self.weight, self.bias)              # (..., out/t)
        if self.gather_output:
            y = gather_from_tp(y, self.group, self.tracer)   # (..., out)
        return y

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features} "
                f"(shard {self.weight.shape[0]} of tp={self.tp}), gather_output={self.gather_output}")


class RowParallelLinear(nn.Module):
    """Y = Σ_r X_r A_rᵀ + b, with A_r the r-th block of in_features/t columns of A.

    Input (..., in/t), this rank's slice of the features (or (..., in) with
    input_is_parallel=False); output (..., out) replicated. weight: (out, in/t); bias:
    (out,), replicated, added once after the all-reduce."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, group=None,
                 input_is_parallel: bool = True, tracer: Tracer | None = None, seed: int = 0,
                 _master: nn.Linear | None = None):
        # Mirrors ColumnParallelLinear.__init__ on purpose (Megatron-LM's pair): the same steps, the other dim.
        super().__init__()
        size = tp_size(group)
        check_divisible("in_features", in_features, size, " (a row-parallel layer splits its inputs)")
        self.in_features, self.out_features = in_features, out_features
        self.group, self.input_is_parallel, self.tracer = group, input_is_parallel, tracer
        self.tp, self.tp_rank = size, tp_rank(group)
        master = _master if _master is not None else _master_linear(in_features, out_features, bias, seed)
        n = in_features // size
        cols = slice(self.tp_rank * n, (self.tp_rank + 1) * n)
        self.weight = nn.Parameter(master.weight.detach()[:, cols].clone())                # (out, in/t)
        self.bias = None if master.bias is None else nn.Parameter(master.bias.detach().clone())

    @classmethod
    def from_linear(cls, linear: nn.Linear, group=None, input_is_parallel: bool = True,
                    tracer: Tracer | None = None) -> "RowParallelLinear":
        """This rank's shard of an existing nn.Linear (the same on every rank)."""
        return cls(linear.in_features, linear.out_features, linear.bias is not None, group=group,
                   input_is_parallel=input_is_parallel, tracer=tracer, _master=linear)

    def forward(self, x):                                    # (..., in/t) or (..., in)
        if not self.input_is_parallel:
            x = scatter_to_tp(x, self.group, self.tracer)    # (..., in/t)
        y = F.linear(x, self.weight)                         # (..., out) partial sum
        y = reduce_from_tp(y, self.group, self.tracer)       # g: Σ_r over the group
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features} (shard {self.weight.shape[1]} of tp={self.tp}), "
                f"out_features={self.out_features}, input_is_parallel={self.input_is_parallel}")
