"""Rabenseifner's all-reduce: a reduce-scatter by recursive halving, then an all-gather
by recursive doubling (Rabenseifner 2004, "Optimization of collective reduction
operations", ICCS; Thakur, Rabenseifner & Gropp 2005, "Optimization of collective
communication operations in MPICH", IJHPCA 19(1), Sec. 4.4).

For N a power of two, with ranks paired by flipping one bit of their rank, largest
distance first:

    halving,  d = N/2, N/4, ..., 1: partner = r XOR d. Both hold the same segment; the
        lower rank keeps the lower half, the higher the upper half; each sends the half it
        gives away and ⊕s the partner's copy of the half it keeps. After log2 N steps
        rank r holds 1/N of the tensor, fully reduced.
    doubling, d = 1, 2, ..., N/2: swap segments with the same partners, in reverse;
        every step doubles what a rank holds, until it holds all of it.

Each rank sends S/2 + S/4 + ... = (N-1)/N · S per phase, like the ring, but in
log2 N steps instead of N-1:

    T_rabenseifner = 2 log2(N) α + 2 (N-1)/N · S β + (N-1)/N · S γ

Any N: with p' the largest power of two <= N and rem = N - p', the first 2·rem ranks
pair up before the algorithm; the odd rank of each pair sends its whole tensor to the
even one and sits out, and gets the result back at the end (Thakur et al. 2005,
Sec. 4.4). The p' remaining ranks get the new ranks 0..p'-1. This costs one extra
S-sized round trip on those ranks. Taught in `notebooks/05_allreduce.ipynb`.
"""
from __future__ import annotations

import torch

from ddnb.collectives.ops import combine, finish, flat_view, prepare
from ddnb.collectives.p2p import exchange, group_rank, group_size, nbytes, recv, send
from ddnb.trace import Tracer, get_tracer


def core_rank(new_rank: int, rem: int) -> int:
    """The group rank of the rank numbered `new_rank` among the p' that take part (rem =
    N - p' ranks folded into their even neighbour): 2·new_rank for the first rem, then
    new_rank + rem."""
    return 2 * new_rank if new_rank < rem else new_rank + rem


def split_halves(lo: int, hi: int, lower: bool) -> tuple[tuple[int, int], tuple[int, int]]:
    """(keep, give) of elements lo..hi-1 at a halving step: the lower rank of a pair
    (lower=True) keeps the lower half, the higher rank the upper half, which is the
    larger one when hi - lo is odd."""
    mid = lo + (hi - lo) // 2
    return ((lo, mid), (mid, hi)) if lower else ((mid, hi), (lo, mid))


def _exchange(give: torch.Tensor, take: torch.Tensor, partner: int, group, tracer, name: str) -> None:
    # An empty half (numel < N) is not sent; the partner computes the same split and skips it too.
    exchange(give if give.numel() else None, partner, take if take.numel() else None, partner,
             group, tracer, name=name)


def halving_doubling_allreduce(tensor: torch.Tensor, op="sum", group=None, tracer: Tracer | None = None,
                               check: bool = True) -> torch.Tensor:
    """All-reduce `tensor` in place by recursive halving then recursive doubling, for any
    world size; returns it. Arguments as `naive_allreduce`."""
    op = prepare(tensor, op, group, tracer, check, what="halving_doubling_allreduce")
    rank, n = group_rank(group), group_size(group)
    if n == 1 or tensor.numel() == 0:
        return tensor
    tr = get_tracer(tracer)
    p2 = 1 << (n.bit_length() - 1)            # p': the largest power of two <= n
    rem = n - p2
    with flat_view(tensor, group) as x:                                 # (numel,)
        numel = x.numel()
        # 1. fold the first 2·rem ranks in pairs: odd -> even
        if rank < 2 * rem and rank % 2 == 1:
            send(x, rank - 1, group, tracer, name="fold")
            new_rank = -1                     # sits out until step 4
        else:
            if rank < 2 * rem:
                incoming = torch.empty_like(x)                          # (numel,)
                recv(incoming, rank + 1, group, tracer, name="fold")
                with tr.span("compute", "reduce", nbytes=nbytes(x)):
                    combine(x, incoming, op)
            new_rank = rank // 2 if rank < 2 * rem else rank - rem
        if new_rank >= 0:
            # 2. recursive halving: reduce-scatter over p' ranks
            buf = torch.empty((numel + 1) // 2, dtype=x.dtype, device=x.device)  # (ceil(numel/2),)
            lo, hi, steps = 0, numel, []
            d = p2 // 2
            while d >= 1:
                partner = new_rank ^ d
                keep, give = split_halves(lo, hi, new_rank < partner)
                mine, incoming = x[keep[0]:keep[1]], buf[:keep[1] - keep[0]]
                _exchange(x[give[0]:give[1]], incoming, core_rank(partner, rem), group, tracer, "halving")
                with tr.span("compute", "reduce", nbytes=nbytes(mine)):
                    combine(mine, incoming, op)
                steps.append((lo, hi, partner, new_rank < partner))
                lo, hi = keep
                d //= 2
            finish(x[lo:hi], op, n, tracer)   # "avg": divide my 1/p' only
            # 3. recursive doubling: all-gather, the same pairs in reverse
            for parent_lo, parent_hi, partner, kept_lower in reversed(steps):
                theirs = (hi, parent_hi) if kept_lower else (parent_lo, lo)
                _exchange(x[lo:hi], x[theirs[0]:theirs[1]], core_rank(partner, rem), group, tracer, "doubling")
                lo, hi = parent_lo, parent_hi
        # 4. unfold: even -> odd
        if rank < 2 * rem:
            if rank % 2 == 1:
                recv(x, rank - 1, group, tracer, name="unfold")
            else:
                send(x, rank + 1, group, tracer, name="unfold")
    return tensor
