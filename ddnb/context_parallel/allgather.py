"""Context parallelism, the naive way first: every rank all-gathers the whole sequence's K
and V, then attends with its own queries. Correct and simple, but each rank holds all of
K and V (2·B·H·S·D elements: the memory context parallelism was meant to divide) and
waits for the whole gather before computing; ring attention (`ring_attention.py`) passes
one block at a time instead and overlaps it with compute. Llama 3 uses this all-gather
form for its context parallelism (Dubey et al. 2024, "The Llama 3 Herd of Models",
Sec. 3.3.2), where K/V are small next to Q thanks to grouped-query attention.

    out_r = softmax(Q_r K^T / sqrt(D) + mask_r) V      Q_r: (B, H, S/N, D) this rank's rows,
                                                      K, V: (B, H, S, D) gathered

The gather is an all-to-all of N copies of the shard (`all_to_all_autograd`, traced), so
its backward is the reduce-scatter of dK, dV for free. Causal masks use each row's
global position, so the zig-zag layout works unchanged. Taught in
`notebooks/13_sequence_context_expert.ipynb`.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ddnb.collectives.autograd import all_to_all_autograd
from ddnb.collectives.p2p import group_rank, group_size
from ddnb.context_parallel.ring_attention import chunks_of, gather_sequence, problems
from ddnb.trace import Tracer


def positions(rank: int, world_size: int, shard_len: int, layout: str, device=None) -> torch.Tensor:
    """The global sequence positions of rank's shard rows, (S/N,), on `device`."""
    piece = shard_len // len(chunks_of(rank, world_size, layout))
    return torch.cat([torch.arange(c * piece, (c + 1) * piece, device=device)
                      for c in chunks_of(rank, world_size, layout)])


def _gather(x: torch.Tensor, n: int, group, tracer) -> list[torch.Tensor]:
    """Every rank's (B, H, s, D) shard, in rank order: an all-to-all of n copies of mine."""
    rows = x.movedim(2, 0)                                              # (s, B, H, D)
    got = all_to_all_autograd(rows.repeat(n, 1, 1, 1), group=group, tracer=tracer)   # (n·s, B, H, D)
    return [g.movedim(0, 2) for g in got.chunk(n, dim=0)]


def allgather_attention(q, k, v, group=None, causal: bool = False, layout: str = "contiguous",
                        tracer: Tracer | None = None):
    """This rank's attention output (B, H, S/N, D) for its shard q, k, v (as
    `split_sequence(x, N, layout)[r]`), equal to F.scaled_dot_product_attention on the
    whole sequence, rows of this shard; differentiable. ValueError before any message when
    this rank's arguments are bad."""
    found = problems(q, k, v, causal, layout)
    if found:
        where = f" on rank {group_rank(group)}" if dist.is_initialized() else ""
        raise ValueError(f"allgather_attention{where}: " + "; ".join(found))
    n, rank = group_size(group), group_rank(group)
    k_full = gather_sequence(_gather(k, n, group, tracer), layout)     # (B, H, S, D), positions in order
    v_full = gather_sequence(_gather(v, n, group, tracer), layout)
    mask = None
    if causal:
        mine = positions(rank, n, q.shape[2], layout, q.device)         # (S/N,), where q is
        mask = mine[:, None] >= torch.arange(k_full.shape[2], device=q.device)[None, :]   # (S/N, S): key <= query
    return F.scaled_dot_product_attention(q, k_full, v_full, attn_mask=mask, scale=1.0 / math.sqrt(q.shape[-1]))


def allgather_bytes_per_rank(batch: int, heads: int, seq_len: int, head_dim: int, world_size: int,
                             element_size: int = 4) -> dict:
    """Bytes one rank sends: forward, its K and V shards to each of the N-1 others,
    2·(N-1)·B·H·(S/N)·D elements; backward, the dK, dV pieces back, the same again."""
    shard = batch * heads * (seq_len // world_size) * head_dim * element_size
    fwd = 2 * (world_size - 1) * shard
    return {"forward": fwd, "backward": fwd}
