"""DeepSpeed-Ulysses: context parallelism by switching what is sharded around attention.

Jacobs et al. 2023, "DeepSpeed Ulysses: System Optimizations for Enabling Training of
Extreme Long Sequence Transformer Models", arXiv 2309.14509, Sec. 3 and Fig. 2. Each of
the N ranks holds a contiguous shard of the sequence, q, k, v of shape (B, H, S/N, D).
Attention mixes positions but not heads, so:

    1. all-to-all: sequence shards -> head shards. Rank r sends heads
       [j·H/N, (j+1)·H/N) of its S/N positions to rank j, and gets every rank's positions
       of its own H/N heads: (B, H, S/N, D) -> (B, H/N, S, D). q, k and v travel in one
       all-to-all (stacked).
    2. ordinary attention over the whole sequence, H/N heads (any kernel:
       F.scaled_dot_product_attention here), causal or not;
    3. all-to-all back: head shards -> sequence shards, (B, H/N, S, D) -> (B, H, S/N, D).

Backward is the same two all-to-alls reversed (`ddnb.collectives.autograd`). It needs
H >= N, and H divisible by N (each rank takes whole heads): the limit of Ulysses, which
ring attention (`ring_attention.py`) does not have. Bytes one rank sends, with n =
B·H·(S/N)·D elements of s bytes in each of its shards (an all-to-all keeps 1/N of the
data home, `ddnb.cost.alltoall_bytes_per_rank`):

    forward   (N-1)/N · (3 + 1) · n·s          q, k, v out; the output back
    backward  the same again                   dO out; dq, dk, dv back

which is the paper's "4Nh/P per link" (Sec. 3.2: sequence N, hidden h, P GPUs) but for
the 1/N a rank keeps. Constant in N for a fixed S/N: the point of Ulysses. Taught in
`notebooks/13_sequence_context_expert.ipynb`.

    out = ulysses_attention(q, k, v, group, causal=True)   # == sdpa on the whole sequence
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ddnb._checks import Checks
from ddnb.collectives.autograd import all_to_all_autograd
from ddnb.collectives.p2p import group_rank, group_size
from ddnb.context_parallel.agree import agree, check_qkv, dtype_code
from ddnb.trace import Tracer


def seq_to_heads(x: torch.Tensor, group=None, tracer: Tracer | None = None) -> torch.Tensor:
    """(P, B, H, S/N, D) sequence shards -> (P, B, H/N, S, D) head shards, one all-to-all
    (P: tensors packed together, e.g. 3 for q, k, v)."""
    n = group_size(group)
    P, B, H, s, D = x.shape
    send = x.reshape(P, B, n, H // n, s, D).permute(2, 0, 1, 3, 4, 5)   # (N, P, B, H/N, S/N, D): row j -> rank j
    got = all_to_all_autograd(send.contiguous(), group=group, tracer=tracer)   # row i: rank i's positions
    return got.permute(1, 2, 3, 0, 4, 5).reshape(P, B, H // n, n * s, D)       # (P, B, H/N, S, D)


def heads_to_seq(y: torch.Tensor, group=None, tracer: Tracer | None = None) -> torch.Tensor:
    """(B, H/N, S, D) head shards -> (B, H, S/N, D) sequence shards: the inverse all-to-all."""
    n = group_size(group)
    B, h, S, D = y.shape
    send = y.reshape(B, h, n, S // n, D).permute(2, 0, 1, 3, 4)         # (N, B, H/N, S/N, D): positions j -> rank j
    got = all_to_all_autograd(send.contiguous(), group=group, tracer=tracer)   # row i: rank i's heads
    return got.permute(1, 0, 2, 3, 4).reshape(B, n * h, S // n, D)      # (B, H, S/N, D)


def ulysses_bytes_per_rank(batch: int, heads: int, seq_len: int, head_dim: int, world_size: int,
                           element_size: int = 4, backward: bool = True) -> float:
    """Bytes one rank sends in one Ulysses attention forward (+ backward): (N-1)/N · 4 of
    its shards of B·H·(S/N)·D elements, twice with backward."""
    shard = batch * heads * (seq_len // world_size) * head_dim * element_size
    return (world_size - 1) / world_size * 4 * shard * (2 if backward else 1)


def problems(q, k, v, causal, world_size: int) -> list[str]:
    """Every problem of one rank's arguments ([] when valid)."""
    check = Checks()
    if check_qkv(check, q, k, v):
        heads = q.shape[1]
        if check.rule(heads >= world_size, f"heads={heads} < N={world_size}: Ulysses gives each rank whole heads, "
                      f"so it needs at least as many heads as ranks (ring attention does not)"):
            check.rule(heads % world_size == 0, f"heads={heads} is not divisible by N={world_size}: each rank "
                                                f"takes H/N whole heads")
    check.rule(isinstance(causal, bool), f"causal={causal!r}: need True or False")
    return check.problems


def ulysses_attention(q, k, v, group=None, causal: bool = False, tracer: Tracer | None = None,
                      check: bool = True) -> torch.Tensor:
    """This rank's attention output (B, H, S/N, D) for its contiguous sequence shard q, k,
    v (each (B, H, S/N, D)), equal to F.scaled_dot_product_attention(Q, K, V,
    is_causal=causal) on the whole sequence, rows of this shard; differentiable. check:
    first agree with the other ranks that the arguments are valid and fit (`agree`)."""
    n = group_size(group)
    found = problems(q, k, v, causal, n)
    if check:
        names = ("batch", "heads", "shard length", "head_dim", "dtype", "causal")
        fields = dict.fromkeys(names, 0) if found else dict(zip(names, (*q.shape, dtype_code(q.dtype), int(causal))))
        agree("ulysses_attention", found, fields, group, tracer)
    elif found:
        raise ValueError(f"ulysses_attention on rank {group_rank(group)}: " + "; ".join(found))
    qh, kh, vh = seq_to_heads(torch.stack([q, k, v]), group, tracer)   # 3 x (B, H/N, S, D)
    out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal)   # (B, H/N, S, D)
    return heads_to_seq(out, group, tracer)                              # (B, H, S/N, D)
