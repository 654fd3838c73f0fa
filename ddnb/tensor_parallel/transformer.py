"""A tensor-parallel transformer: ddnb.models' GPT with every matmul split across the t
ranks of a tensor-parallel group, as in Megatron-LM (Shoeybi et al. 2019, arXiv
1909.08053, Sec. 3, Fig. 3).

    MLP        fc column-parallel (each rank h/t hidden units), GELU locally (Eq. 3),
               proj row-parallel:           f -> fc_r -> GELU -> proj_r -> g
    attention  heads split: rank r computes nh/t whole heads (q, k, v of those heads
               from its rows of the fused qkv weight), attends locally, proj
               row-parallel:                f -> qkv_r -> attention_r -> proj_r -> g
    block      LayerNorms replicated; two g (all-reduces) in forward, two f in backward
    GPT        vocab-parallel embedding (embedding.py), the blocks, a replicated final
               LayerNorm and a column-parallel output layer whose logit slices feed
               vocab_parallel_cross_entropy without ever being gathered

Every module is built `from_module(reference, group)` from the unsharded ddnb.models
module, keeping this rank's blocks of its weights, so forward and gradients equal the
reference's (tests/test_tensor_parallel.py). Divisibility (heads, hidden sizes,
vocabulary by t) is checked first, before any communication. Taught in
`notebooks/10_tensor_parallelism.ipynb`.

    tp_model = TensorParallelGPT.from_module(gpt(cfg), group)
    loss = tp_model.loss(idx, targets)          # == lm_loss(gpt(cfg)(idx), targets)
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from ddnb.models import causal_attention
from ddnb.tensor_parallel.comms import tp_size
from ddnb.tensor_parallel.embedding import VocabParallelEmbedding, vocab_parallel_cross_entropy
from ddnb.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear, check_divisible
from ddnb.trace import Tracer


class TensorParallelMLP(nn.Module):
    """(B, T, d) replicated -> (B, T, d) replicated; hidden (B, T, h/t) on each rank."""

    def __init__(self, fc: ColumnParallelLinear, act: nn.Module, proj: RowParallelLinear):
        super().__init__()
        self.fc, self.act, self.proj = fc, act, proj

    @classmethod
    def from_module(cls, mlp, group=None, tracer: Tracer | None = None) -> "TensorParallelMLP":
        """From a ddnb.models.MLP (fc, act, proj)."""
        check_divisible("MLP hidden size (fc.out_features)", mlp.fc.out_features, tp_size(group))
        return cls(ColumnParallelLinear.from_linear(mlp.fc, group, tracer=tracer), copy.deepcopy(mlp.act),
                   RowParallelLinear.from_linear(mlp.proj, group, tracer=tracer))

    def forward(self, x):                                    # (B, T, d)
        return self.proj(self.act(self.fc(x)))               # (B, T, h/t) inside; one all-reduce (g)


def qkv_shard_order(d_model: int, n_heads: int, tp: int) -> torch.Tensor:
    """The permutation of the fused qkv weight's 3d rows that makes rank r's shard one
    contiguous block [q rows of its heads, k rows of its heads, v rows of its heads].

    qkv.weight stacks W_Q, W_K, W_V (rows [0:d], [d:2d], [2d:3d]); head j owns rows
    [j·hs, (j+1)·hs) of each. A plain column split would give rank 0 all of W_Q and part
    of W_K; instead rank r takes heads [r·nh/t, (r+1)·nh/t), i.e. channels
    [r·d/t, (r+1)·d/t) of each of q, k and v. Returns (3d,) int64: block r of 3d/t
    entries is rank r's rows, in q, k, v order."""
    check_divisible("n_heads", n_heads, tp, " (attention heads are split across the tensor-parallel ranks)")
    n = d_model // tp
    return torch.cat([torch.arange(part * d_model + r * n, part * d_model + (r + 1) * n)
                      for r in range(tp) for part in range(3)])


class TensorParallelAttention(nn.Module):
    """Causal self-attention with nh/t heads on each rank: (B, T, d) -> (B, T, d).

    `attend(q, k, v)` (B, nh/t, T, hs) x 3 -> (B, nh/t, T, hs) is the attention itself:
    ddnb.models.causal_attention by default; context parallelism puts ring attention over
    the sequence shards here (ddnb.grid4d), the heads staying split as they are."""

    def __init__(self, qkv: ColumnParallelLinear, proj: RowParallelLinear, n_heads: int, attend=causal_attention):
        super().__init__()
        self.qkv, self.proj = qkv, proj
        self.n_heads = n_heads                               # all heads; this rank has n_heads / t
        self.local_heads = n_heads // qkv.tp
        self.attend = attend

    @classmethod
    def from_module(cls, attn, group=None, tracer: Tracer | None = None) -> "TensorParallelAttention":
        """From a ddnb.models.CausalSelfAttention (qkv: Linear(d, 3d), proj: Linear(d, d), n_heads)."""
        t, d = tp_size(group), attn.qkv.in_features
        order = qkv_shard_order(d, attn.n_heads, t)          # validates n_heads % t first
        reordered = nn.Linear(d, 3 * d)
        with torch.no_grad():
            reordered.weight.copy_(attn.qkv.weight[order])
            reordered.bias.copy_(attn.qkv.bias[order])
        return cls(ColumnParallelLinear.from_linear(reordered, group, tracer=tracer),
                   RowParallelLinear.from_linear(attn.proj, group, tracer=tracer), attn.n_heads)

    def forward(self, x):                                    # (B, T, d)
        B, T, _ = x.shape
        n = self.qkv.weight.shape[0] // 3                    # d/t channels: local_heads · hs
        q, k, v = self.qkv(x).split(n, dim=2)                # 3 x (B, T, d/t); f inside qkv
        q, k, v = (t.view(B, T, self.local_heads, n // self.local_heads).transpose(1, 2)
                   for t in (q, k, v))                       # (B, nh/t, T, hs)
        y = self.attend(q, k, v)                             # (B, nh/t, T, hs): heads are independent
        y = y.transpose(1, 2).contiguous().view(B, T, n)     # (B, T, d/t): my heads side by side
        return self.proj(y)                                  # (B, T, d); g inside proj


class TensorParallelBlock(nn.Module):
    """x = x + attn(ln1(x)); x = x + mlp(ln2(x)) with TP attention and MLP: two all-reduces
    in forward (g after attn.proj and mlp.proj), two in backward (f before attn.qkv, mlp.fc)."""

    def __init__(self, ln1, attn, ln2, mlp):
        super().__init__()
        self.ln1, self.attn, self.ln2, self.mlp = ln1, attn, ln2, mlp

    @classmethod
    def from_module(cls, block, group=None, tracer: Tracer | None = None) -> "TensorParallelBlock":
        attn = TensorParallelAttention.from_module(block.attn, group, tracer)
        mlp = TensorParallelMLP.from_module(block.mlp, group, tracer)
        return cls(copy.deepcopy(block.ln1), attn, copy.deepcopy(block.ln2), mlp)

    def forward(self, x):                                    # (B, T, d)
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TensorParallelGPT(nn.Module):
    """ddnb.models.gpt split over a tensor-parallel group: idx (B, T) -> logit slices
    (B, T, V/t); `loss(idx, targets)` is the vocab-parallel cross-entropy of them."""

    def __init__(self, tok, pos, blocks, ln_f, out, group=None, tracer: Tracer | None = None):
        super().__init__()
        self.tok, self.pos, self.blocks, self.ln_f, self.out = tok, pos, nn.ModuleList(blocks), ln_f, out
        self.group, self.tracer = group, tracer

    @classmethod
    def from_module(cls, model: nn.Sequential, group=None, tracer: Tracer | None = None) -> "TensorParallelGPT":
        """From ddnb.models.gpt's Sequential(Embedding, Block, ..., Block, Head)."""
        emb, *blocks, head = list(model)
        t = tp_size(group)
        check_divisible("vocab_size", emb.tok.num_embeddings, t)     # every size checked before any layer is built
        for b in blocks:
            check_divisible("n_heads", b.attn.n_heads, t)
            check_divisible("MLP hidden size (fc.out_features)", b.mlp.fc.out_features, t)
        return cls(VocabParallelEmbedding.from_embedding(emb.tok, group, tracer), copy.deepcopy(emb.pos),
                   [TensorParallelBlock.from_module(b, group, tracer) for b in blocks], copy.deepcopy(head.ln_f),
                   ColumnParallelLinear.from_linear(head.out, group, tracer=tracer), group, tracer)

    def forward(self, idx):                                  # (B, T) int64
        T = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(T, device=idx.device))   # (B, T, d); g inside tok
        for block in self.blocks:
            x = block(x)                                     # (B, T, d)
        return self.out(self.ln_f(x))                        # (B, T, V/t): never gathered

    def loss(self, idx, targets):
        return vocab_parallel_cross_entropy(self(idx), targets, self.group, tracer=self.tracer)
