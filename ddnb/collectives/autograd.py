"""The all-to-all as a differentiable operation, for the layers that route activations
with it (expert parallelism: tokens to their experts and back; Ulysses: sequence shards
to head shards and back).

An all-to-all is a permutation of rows across the ranks: rank i's input chunk j becomes
rank j's output chunk i. Its adjoint is the inverse permutation, the all-to-all with
the split sizes swapped, so backward sends each gradient row back along the way its
row came (the "dispatch" / "combine" pair of GShard, Lepikhin et al. 2020, Sec. 3.2,
is one such pair; DeepSpeed-Ulysses' backward is the same, Jacobs et al. 2023, Sec. 3):

    forward    y = all_to_all(x, output_split_sizes=o, input_split_sizes=i)
    backward   dx = all_to_all(dy, output_split_sizes=i, input_split_sizes=o)

Built on the from-scratch pairwise all-to-all (`all_to_all.py`), so every message is
traced. check=False inside: a layer checks its call once across ranks (e.g.
`ddnb.context_parallel.agree`) and its split sizes agree by construction (exchanged
first); this rank's own problems (split sizes that do not sum to the rows) still raise
here, before any message. Taught in `notebooks/13_sequence_context_expert.ipynb`.
"""
from __future__ import annotations

import torch

from ddnb.collectives.all_to_all import all_to_all
from ddnb.trace import Tracer


def _rows_out(x, output_split_sizes) -> int:
    if output_split_sizes is None:
        return x.shape[0]
    return max(0, sum(output_split_sizes)) if all(isinstance(s, int) for s in output_split_sizes) else 0


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, output_split_sizes, input_split_sizes, group, tracer):     # (rows_in, *row)
        ctx.args = output_split_sizes, input_split_sizes, group, tracer
        out = x.new_empty((_rows_out(x, output_split_sizes), *x.shape[1:]))  # (rows_out, *row)
        return all_to_all(out, x.contiguous(), output_split_sizes, input_split_sizes, group, tracer, check=False)

    @staticmethod
    def backward(ctx, grad):                                                        # (rows_out, *row)
        output_split_sizes, input_split_sizes, group, tracer = ctx.args
        rows_in = sum(input_split_sizes) if input_split_sizes is not None else grad.shape[0]
        dx = grad.new_empty((rows_in, *grad.shape[1:]))                             # (rows_in, *row)
        all_to_all(dx, grad.contiguous(), input_split_sizes, output_split_sizes, group, tracer, check=False)
        return dx, None, None, None, None


def all_to_all_autograd(x: torch.Tensor, output_split_sizes=None, input_split_sizes=None, group=None,
                        tracer: Tracer | None = None) -> torch.Tensor:
    """all_to_all of x's rows (dim 0) into a new tensor of sum(output_split_sizes) rows (x's
    row count with equal splits), differentiable: backward is the all-to-all with the
    split sizes swapped. ValueError (this rank, before any message) when a split list does
    not have N entries or does not sum to its tensor's rows."""
    return _AllToAll.apply(x, output_split_sizes, input_split_sizes, group, tracer)
