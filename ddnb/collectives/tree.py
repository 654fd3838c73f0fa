"""Binomial-tree reduce and broadcast, and the all-reduce made of the two.

Ranks are renumbered relative to the root, v = (rank - root) mod N. In round k
(mask = 2^k) of the reduce, every v with bit k set sends its partial result to
v - 2^k and drops out; the others receive from v + 2^k (if it exists) and combine.
After ceil(log2 N) rounds the root holds x_0 ⊕ ... ⊕ x_{N-1}. The broadcast runs the
same tree backwards: v receives from its parent (v with its lowest set bit cleared) and
sends to v + 2^j for every j below that bit. For N = 8, root 0:

    reduce      round 0: 1->0 3->2 5->4 7->6   round 1: 2->0 6->4   round 2: 4->0
    broadcast   round 0: 0->4                  round 1: 0->2 4->6   round 2: 0->1 2->3 4->5 6->7

Cost (Thakur, Rabenseifner & Gropp 2005, IJHPCA 19(1), Sec. 4): each of the
ceil(log2 N) rounds moves the whole tensor, so

    T_tree_allreduce = 2 ceil(log2 N) (α + S β)

better than naive's 2(N-1)(α + Sβ) in both terms; still S β per round, which the ring
(`ring.py`) cuts to about 2 S β in total. The tree is the right choice for small S,
where the α term dominates. Taught in `notebooks/05_allreduce.ipynb`.
"""
from __future__ import annotations

import torch

from ddnb.collectives.ops import combine, finish, flat_view, prepare
from ddnb.collectives.p2p import group_rank, group_size, nbytes, recv, send
from ddnb.trace import Tracer, get_tracer


def _tree_reduce(x: torch.Tensor, root: int, op: str, rank: int, n: int, group, tracer) -> None:
    """Binomial-tree reduce of the flat x (numel,) into x on `root`; x is the workspace."""
    v = (rank - root) % n
    incoming = None
    mask = 1
    while mask < n:
        if v & mask:                                   # my subtree is done: hand it to my parent
            send(x, (v - mask + root) % n, group, tracer, name="reduce")
            return
        if v + mask < n:                               # a child subtree of 2^k ranks
            incoming = torch.empty_like(x) if incoming is None else incoming
            recv(incoming, (v + mask + root) % n, group, tracer, name="reduce")
            with get_tracer(tracer).span("compute", "reduce", nbytes=nbytes(x)):
                combine(x, incoming, op)
        mask <<= 1


def _tree_broadcast(x: torch.Tensor, root: int, rank: int, n: int, group, tracer) -> None:
    """Binomial-tree broadcast of the flat x (numel,) from `root` into x on every rank."""
    v = (rank - root) % n
    mask = 1
    while mask < n:                                    # find my parent: my lowest set bit
        if v & mask:
            recv(x, (v - mask + root) % n, group, tracer, name="broadcast")
            break
        mask <<= 1
    mask >>= 1
    while mask > 0:                                    # my children: v + 2^j below that bit
        if v + mask < n:
            send(x, (v + mask + root) % n, group, tracer, name="broadcast")
        mask >>= 1


def reduce(tensor: torch.Tensor, dst: int = 0, op="sum", group=None, tracer: Tracer | None = None,
           check: bool = True) -> torch.Tensor:
    """Reduce every rank's `tensor` into `tensor` on rank `dst` (a rank of `group`), by a
    binomial tree; returns it. The other ranks' tensors are left unchanged."""
    op = prepare(tensor, op, group, tracer, check, what="reduce", root=dst)
    rank, n = group_rank(group), group_size(group)
    if n == 1 or tensor.numel() == 0:
        return tensor
    with flat_view(tensor, group) as x:                                # (numel,)
        v = (rank - dst) % n
        has_children = v % 2 == 0 and v + 1 < n     # the smallest child is v + 1
        work = x.clone() if rank != dst and has_children else x   # keep non-dst inputs intact
        _tree_reduce(work, dst, op, rank, n, group, tracer)
        if rank == dst:
            finish(x, op, n, tracer)
    return tensor


def broadcast(tensor: torch.Tensor, src: int = 0, group=None, tracer: Tracer | None = None,
              check: bool = True) -> torch.Tensor:
    """Copy `tensor` of rank `src` into `tensor` on every rank, by a binomial tree; returns it."""
    prepare(tensor, None, group, tracer, check, what="broadcast", root=src)
    rank, n = group_rank(group), group_size(group)
    if n == 1 or tensor.numel() == 0:
        return tensor
    with flat_view(tensor, group) as x:
        _tree_broadcast(x, src, rank, n, group, tracer)
    return tensor


def tree_allreduce(tensor: torch.Tensor, op="sum", group=None, tracer: Tracer | None = None,
                   check: bool = True) -> torch.Tensor:
    """All-reduce `tensor` in place: binomial-tree reduce to rank 0, then binomial-tree
    broadcast from rank 0; returns it. Arguments as `naive_allreduce`."""
    op = prepare(tensor, op, group, tracer, check, what="tree_allreduce")
    rank, n = group_rank(group), group_size(group)
    if n == 1 or tensor.numel() == 0:
        return tensor
    with flat_view(tensor, group) as x:                                # (numel,)
        _tree_reduce(x, 0, op, rank, n, group, tracer)
        if rank == 0:
            finish(x, op, n, tracer)
        _tree_broadcast(x, 0, rank, n, group, tracer)
    return tensor
