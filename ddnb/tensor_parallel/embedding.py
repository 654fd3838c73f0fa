"""The vocabulary split across the tensor-parallel group: embedding rows and output logits.

The embedding E (V, d) and the output projection W (V, d) of a language model are its
largest matrices when V is large; Megatron-LM splits both along the vocabulary (Shoeybi et
al. 2019, arXiv 1909.08053, Sec. 3, "the output embedding weight matrix ... is
parallelized along the vocabulary dimension"): rank r of t holds the rows
[r·V/t, (r+1)·V/t).

VocabParallelEmbedding: each rank looks up the token ids that fall in its rows, writes
zeros for the others, and `g` (an all-reduce) sums the t partial lookups: exactly one
rank contributed each token's row.

Cross-entropy without gathering the logits: each rank holds logits z (N, V/t), its slice
of the vocabulary. ℓ_i = log Σ_v exp(z_iv) − z_{i,y_i}, computed with three all-reduces of
N numbers instead of an all-gather of N·V (Sec. 3: "fuse the output of the parallel GEMM
with the cross entropy loss, which reduces the dimension to b × s"):

    m_i = max_v z_iv            all-reduce MAX   (for a stable exp: subtract m_i)
    z_{i,y_i} − m_i             all-reduce SUM   (only the rank holding y_i contributes)
    Σ_v exp(z_iv − m_i)         all-reduce SUM

and the gradient, softmax(z)_iv − 1[v = y_i], is local: backward communicates nothing.
`gathered_cross_entropy` is the naive version (all-gather the logits, then
F.cross_entropy), for comparison. Taught in `notebooks/10_tensor_parallelism.ipynb`.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ddnb.tensor_parallel.comms import all_reduce, gather_from_tp, reduce_from_tp, tp_rank, tp_size
from ddnb.tensor_parallel.layers import check_divisible
from ddnb.trace import Tracer

IGNORE = -100


class VocabParallelEmbedding(nn.Module):
    """idx (B, T) int64 -> (B, T, d), with this rank holding rows [start, end) of the
    (V, d) table: weight (V/t, d)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, group=None, tracer: Tracer | None = None,
                 seed: int = 0, _master: nn.Embedding | None = None):
        super().__init__()
        size = tp_size(group)
        check_divisible("num_embeddings (vocabulary size)", num_embeddings, size,
                        " (a vocab-parallel embedding splits its rows)")
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.group, self.tracer, self.tp = group, tracer, size
        n = num_embeddings // size
        self.vocab_start = tp_rank(group) * n
        self.vocab_end = self.vocab_start + n
        if _master is None:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                _master = nn.Embedding(num_embeddings, embedding_dim)
        self.weight = nn.Parameter(_master.weight.detach()[self.vocab_start:self.vocab_end].clone())   # (V/t, d)

    @classmethod
    def from_embedding(cls, embedding: nn.Embedding, group=None, tracer: Tracer | None = None):
        return cls(embedding.num_embeddings, embedding.embedding_dim, group=group, tracer=tracer, _master=embedding)

    def forward(self, idx):                                              # (B, T)
        outside = (idx < self.vocab_start) | (idx >= self.vocab_end)     # (B, T): another rank's rows
        local = (idx - self.vocab_start).masked_fill(outside, 0)
        out = F.embedding(local, self.weight)                            # (B, T, d)
        out = out.masked_fill(outside.unsqueeze(-1), 0.0)
        return reduce_from_tp(out, self.group, self.tracer, name="embedding")   # g: one rank's row per token

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim}, "
                f"rows [{self.vocab_start}, {self.vocab_end}) of tp={self.tp}")


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, group, tracer):                    # (N, V/t), (N,)
        n = logits.shape[-1]
        start = tp_rank(group) * n
        m = logits.max(dim=-1).values                                    # (N,)
        all_reduce(m, group, tracer, name="ce max", op=dist.ReduceOp.MAX)
        shifted = logits - m.unsqueeze(-1)                               # (N, V/t)
        mine = (targets >= start) & (targets < start + n)                # (N,): y_i in my slice
        local = (targets - start).masked_fill(~mine, 0)
        target_logit = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(~mine, 0.0)   # (N,)
        all_reduce(target_logit, group, tracer, name="ce target")
        exp = shifted.exp()                                              # (N, V/t)
        sum_exp = exp.sum(dim=-1)                                        # (N,)
        all_reduce(sum_exp, group, tracer, name="ce sum-exp")
        ctx.save_for_backward(exp.div_(sum_exp.unsqueeze(-1)), mine, local)   # softmax, (N, V/t)
        return sum_exp.log() - target_logit                              # (N,) ℓ_i

    @staticmethod
    def backward(ctx, grad):                                             # (N,)
        softmax, mine, local = ctx.saved_tensors
        g = softmax.clone()
        g.scatter_add_(-1, local.unsqueeze(-1), -mine.to(g.dtype).unsqueeze(-1))   # softmax − one_hot(y)
        return g * grad.unsqueeze(-1), None, None, None


def vocab_parallel_cross_entropy(logits, targets, group=None, ignore_index: int = IGNORE,
                                 tracer: Tracer | None = None, reduction: str = "mean"):
    """Mean cross-entropy over the targets != ignore_index, from this rank's logit slice.
    logits (..., V/t), targets (...) int64 in [0, V) or ignore_index -> scalar, equal to
    F.cross_entropy(full_logits, targets, ignore_index=ignore_index). reduction="sum": the
    sum instead (0 when every target is ignored), for a caller that divides by a count over
    several ranks (a sequence shard of context parallelism may score no target at all)."""
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction={reduction!r} is not one of ['mean', 'sum']")
    z = logits.reshape(-1, logits.shape[-1])                             # (N, V/t)
    y = targets.reshape(-1)                                              # (N,)
    keep = y != ignore_index
    per_token = _VocabParallelCrossEntropy.apply(z, y.masked_fill(~keep, 0), group, tracer)   # (N,)
    total = (per_token * keep).sum()
    return total if reduction == "sum" else total / keep.sum()


def gathered_cross_entropy(logits, targets, group=None, ignore_index: int = IGNORE,
                           tracer: Tracer | None = None):
    """The naive way: all-gather the (..., V/t) slices into (..., V) logits on every rank,
    then F.cross_entropy. Moves N·V numbers instead of 3·N."""
    full = gather_from_tp(logits, group, tracer, name="logits")         # (..., V)
    return F.cross_entropy(full.reshape(-1, full.shape[-1]), targets.reshape(-1), ignore_index=ignore_index)
