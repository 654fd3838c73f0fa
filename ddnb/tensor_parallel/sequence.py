"""Sequence parallelism: the tensor-parallel block with its LayerNorms (and dropouts, were
there any) on sequence shards, so that no activation of the block is kept whole on
every rank.

Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", arXiv 2205.05198, Sec. 4.2.2 and Fig. 5. In Megatron's tensor parallelism
(transformer.py) the LayerNorms, the dropouts and the residual stream are replicated:
every rank computes and stores them for all s positions. Sequence parallelism shards
them along the sequence (each of the t ranks holds s/t positions) and replaces each of
the block's all-reduces by the two halves an all-reduce is made of (a ring all-reduce
*is* a reduce-scatter then an all-gather, so the bytes are the same):

    g   (before a column-parallel matmul)  forward: all-gather (seq)    backward: reduce-scatter
    ḡ   (after a row-parallel matmul)      forward: reduce-scatter      backward: all-gather

    x_shard -> LN1 -> g -> qkv_r -> attention_r -> proj_r -> ḡ -> + x_shard
            -> LN2 -> g -> fc_r -> GELU -> proj_r -> ḡ -> + ...            (B, T/t, d) in and out

and the column-parallel matmul after g keeps only its *shard* of the gathered input for
backward, gathering it again there (Sec. 4.2.2: "we store Y_i^s ... and perform an extra
all-gather in the backward pass"): `_GatherLinear`.

Activation memory per layer per rank (Sec. 4.1 and Table 2; s sequence, b batch, h
hidden, a heads, 16-bit activations, 1-byte dropout masks):

    tensor parallel      s·b·h·(10 + 24/t + 5·a·s/(h·t))
    + sequence parallel  s·b·h·(34/t + 5·a·s/(h·t))

With e bytes per element and m bytes per dropout mask element the terms are: 10 = 4e+2m
replicated (LN inputs, qkv and fc inputs, two dropout masks), 24 = 12e split (q, k, v,
proj input, GELU input, fc2 input), 5 = 2e+m per attention score (softmax output, its
dropout mask and output). ddnb's block has no dropout (m = 0, and the softmax output
is the one tensor attention@V saves: e per score, not 2e) and float32 (e = 4):

    ours, tp   s·b·h·(16 + 48/t) + 4·a·s²·b/t          ours, tp+sp  s·b·h·64/t + 4·a·s²·b/t

plus what the paper leaves out as small: LayerNorm mean and 1/std (2 numbers per position
per LayerNorm) and the causal mask (s² bools, 1 byte each). `activation_formula` gives
either; tests/test_sequence_parallel.py measures both blocks with
ddnb.memory.SavedActivations and compares. Taught in
`notebooks/13_sequence_context_expert.ipynb`.

    sp_block = SequenceParallelBlock.from_module(block, group)    # block: ddnb.models.Block
    y_shard = sp_block(x_shard)                                   # (B, T/t, d) == block(x) rows
"""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ddnb._checks import Checks
from ddnb.collectives import traced
from ddnb.models import causal_attention
from ddnb.tensor_parallel.comms import tp_size
from ddnb.tensor_parallel.transformer import TensorParallelAttention, TensorParallelMLP
from ddnb.trace import Tracer


def all_gather_seq(x, group=None, tracer: Tracer | None = None, phase: str = "forward"):
    """(B, T/t, d) on each rank -> (B, T, d), rank 0's positions first."""
    if tp_size(group) == 1:
        return x
    parts = traced.all_gather(x, group, tracer, f"all_gather sp {phase}", phase=phase)   # (t, B, T/t, d)
    return torch.cat(list(parts.unbind(0)), dim=1)


def reduce_scatter_seq(x, group=None, tracer: Tracer | None = None, phase: str = "forward"):
    """(B, T, d) partial sums on each rank -> this rank's (B, T/t, d) of their sum."""
    t = tp_size(group)
    if t == 1:
        return x
    return traced.reduce_scatter(list(x.chunk(t, dim=1)), group, tracer, f"reduce_scatter sp {phase}", phase=phase)


class _ReduceScatterSeq(torch.autograd.Function):
    """ḡ: reduce-scatter forward, all-gather backward (Korthikanti et al. 2022, Fig. 5)."""

    @staticmethod
    def forward(ctx, x, group, tracer):
        ctx.group, ctx.tracer = group, tracer
        return reduce_scatter_seq(x, group, tracer)

    @staticmethod
    def backward(ctx, grad):
        return all_gather_seq(grad, ctx.group, ctx.tracer, "backward"), None, None


class _GatherLinear(torch.autograd.Function):
    """g then a column-parallel linear: y = all_gather(x_shard) Wᵀ + b, storing only
    x_shard (B, T/t, d) and gathering it again in backward (Sec. 4.2.2)."""

    @staticmethod
    def forward(ctx, x, weight, bias, group, tracer):                  # (B, T/t, d), (o, d), (o,)
        ctx.save_for_backward(x, weight)
        ctx.group, ctx.tracer = group, tracer
        return F.linear(all_gather_seq(x, group, tracer), weight, bias)   # (B, T, o)

    @staticmethod
    def backward(ctx, grad):                                           # (B, T, o)
        x, weight = ctx.saved_tensors
        full = all_gather_seq(x, ctx.group, ctx.tracer, "backward")     # (B, T, d) again
        dx = reduce_scatter_seq(grad @ weight, ctx.group, ctx.tracer, "backward")   # (B, T/t, d)
        dw = grad.reshape(-1, grad.shape[-1]).t() @ full.reshape(-1, full.shape[-1])   # (o, d)
        return dx, dw, grad.sum(dim=(0, 1)), None, None


class SequenceParallelBlock(nn.Module):
    """ddnb.models.Block on sequence shards: x (B, T/t, d), rank r holding positions
    [r·T/t, (r+1)·T/t) -> the same rows of block(x). The weights are the tensor-parallel
    shards of TensorParallelAttention / TensorParallelMLP (heads and hidden units split)."""

    def __init__(self, ln1, attn: TensorParallelAttention, ln2, mlp: TensorParallelMLP, group=None,
                 tracer: Tracer | None = None):
        super().__init__()
        self.ln1, self.attn, self.ln2, self.mlp = ln1, attn, ln2, mlp
        self.group, self.tracer, self.t = group, tracer, tp_size(group)

    @classmethod
    def from_module(cls, block, group=None, tracer: Tracer | None = None) -> "SequenceParallelBlock":
        return cls(copy.deepcopy(block.ln1), TensorParallelAttention.from_module(block.attn, group, tracer),
                   copy.deepcopy(block.ln2), TensorParallelMLP.from_module(block.mlp, group, tracer), group, tracer)

    def _attention(self, h):                                           # (B, T/t, d)
        qkv = _GatherLinear.apply(h, self.attn.qkv.weight, self.attn.qkv.bias, self.group, self.tracer)
        B, T, n3 = qkv.shape                                           # n3 = 3·d/t
        heads = self.attn.local_heads
        q, k, v = (u.view(B, T, heads, n3 // 3 // heads).transpose(1, 2) for u in qkv.split(n3 // 3, dim=2))
        y = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, n3 // 3)   # (B, T, d/t)
        partial = F.linear(y, self.attn.proj.weight)                    # (B, T, d): this rank's heads' part
        return _ReduceScatterSeq.apply(partial, self.group, self.tracer) + self.attn.proj.bias   # (B, T/t, d)

    def _mlp(self, h):                                                 # (B, T/t, d)
        u = _GatherLinear.apply(h, self.mlp.fc.weight, self.mlp.fc.bias, self.group, self.tracer)  # (B, T, 4d/t)
        partial = F.linear(self.mlp.act(u), self.mlp.proj.weight)      # (B, T, d)
        return _ReduceScatterSeq.apply(partial, self.group, self.tracer) + self.mlp.proj.bias

    def forward(self, x):                                              # (B, T/t, d)
        x = x + self._attention(self.ln1(x))
        return x + self._mlp(self.ln2(x))


@torch.no_grad()
def sync_sequence_parallel_grads(block: SequenceParallelBlock) -> None:
    """Sum over the group the gradients of the parameters every rank holds whole but
    applied to its own positions only: the LayerNorms' and the row-parallel biases
    (Megatron-LM all-reduces these "sequence-parallel" gradients the same way)."""
    if block.t == 1:
        return
    for p in [*block.ln1.parameters(), *block.ln2.parameters(), block.attn.proj.bias, block.mlp.proj.bias]:
        if p is not None and p.grad is not None:
            dist.all_reduce(p.grad, group=block.group)


def activation_formula(s: int, b: int, h: int, a: int, t: int, sequence_parallel: bool, paper: bool = True,
                       small_terms: bool = False) -> float:
    """Activation bytes per layer per rank. paper=True: Korthikanti et al.'s Table 2
    (16-bit, dropout): sbh(10 + 24/t + 5as/(ht)) or, with sequence parallelism,
    sbh(34/t + 5as/(ht)). paper=False: ddnb's block (float32, no dropout): sbh(16 + 48/t)
    + 4as²b/t or sbh·64/t + 4as²b/t; small_terms adds the LayerNorms' mean and 1/std
    (2 LayerNorms · 2 · 4 bytes per position held) and the s² bytes of the causal mask."""
    with Checks("activation_formula") as check:
        check.positive_ints(s=s, b=b, h=h, a=a, t=t)
    e, m = (2, 1) if paper else (4, 0)
    replicated, split, score = 4 * e + 2 * m, 12 * e, (2 * e + m) if paper else e
    per_position = (replicated + split) / t if sequence_parallel else replicated + split / t
    total = s * b * h * per_position + a * s * s * b * score / t
    if small_terms:
        total += 2 * 2 * 4 * s * b / (t if sequence_parallel else 1) + s * s
    return total
