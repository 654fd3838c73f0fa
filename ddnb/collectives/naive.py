"""The naive all-reduce: every rank sends its whole tensor to rank 0, rank 0 reduces,
then sends the result back to every rank.

    gather:     rank r -> rank 0          N-1 messages of S bytes, all into rank 0's link
    reduce:     rank 0: x = x_0 ⊕ x_1 ⊕ ... ⊕ x_{N-1}   (in rank order)
    broadcast:  rank 0 -> rank r          N-1 messages of S bytes, all out of rank 0's link

Rank 0 receives (N-1)·S bytes and sends (N-1)·S bytes, so with the α-β cost model
(Thakur, Rabenseifner & Gropp 2005, "Optimization of collective communication operations
in MPICH", IJHPCA 19(1)) the time grows with N:

    T_naive = 2 (N-1) (α + S β)

while every other rank sends only S. The root's link is the bottleneck, which is what
`tree.py` (log N rounds) and `ring.py` (2(N-1)/N · S per rank) improve on.
Taught in `notebooks/05_allreduce.ipynb`, the first all-reduce the notebook builds.
"""
from __future__ import annotations

import torch

from ddnb.collectives.ops import combine, finish, flat_view, prepare
from ddnb.collectives.p2p import group_rank, group_size, nbytes, recv, send
from ddnb.trace import Tracer, get_tracer

ROOT = 0


def naive_allreduce(tensor: torch.Tensor, op="sum", group=None, tracer: Tracer | None = None,
                    check: bool = True) -> torch.Tensor:
    """All-reduce `tensor` in place by gather-to-rank-0, reduce, send-back; returns it.

    op: "sum", "avg", "max", "min", "product" (or torch.distributed.ReduceOp.*).
    check: first verify that all ranks passed the same shape, dtype and op (cheap; turn
    off only in benchmarks). Call it on every rank of `group` with the same arguments.
    """
    op = prepare(tensor, op, group, tracer, check, what="naive_allreduce")
    rank, n = group_rank(group), group_size(group)
    if n == 1 or tensor.numel() == 0:
        return tensor
    with flat_view(tensor, group) as x:                            # (numel,)
        if rank == ROOT:
            incoming = torch.empty_like(x)                         # (numel,)
            for src in range(n):                                   # one link: one message at a time
                if src == ROOT:
                    continue
                recv(incoming, src, group, tracer, name="gather")
                with get_tracer(tracer).span("compute", "reduce", nbytes=nbytes(x)):
                    combine(x, incoming, op)
            finish(x, op, n, tracer)
            for dst in range(n):
                if dst != ROOT:
                    send(x, dst, group, tracer, name="broadcast")
        else:
            send(x, ROOT, group, tracer, name="gather")
            recv(x, ROOT, group, tracer, name="broadcast")
    return tensor
