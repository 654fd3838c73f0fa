"""One gossip step on real processes, and how far apart the workers are.

    mixed = gossip(x, topo)              # x_i <- sum_j W[i, j] x_j, over ddnb.collectives.p2p
    pending = start_gossip(x, topo)      # the same, posted now ...
    mixed = pending.finish()             # ... and completed later (overlap it with compute)
    xi = consensus_distance(x)           # sqrt(1/N sum_i ||x_i - mean||^2), a measurement

Rank i sends its x (S,) to each out-neighbour and receives x_j from each in-neighbour
(`Topology`), all posted at once with `p2p.post`, so no pair waits for the other to post
first: per gossip step a worker sends out_degree · S bytes and receives in_degree · S
(Lian et al. 2017, "Can Decentralized Algorithms Outperform Centralized Algorithms?",
NeurIPS, Sec. 3: "each worker only communicates with its neighbours"). Every message is
traced as "send"/"recv" named "gossip". The weighted sum is taken in the same order on
every rank and in the single-process reference (`mix_row`: own term first, then the
neighbours by rank), so the two agree to the last bit.

`consensus_distance` is a *measurement*, not part of any algorithm: it uses
torch.distributed's all_reduce directly, outside ddnb's trace, so the bytes it moves never
count in a method's bytes per step. Taught in `notebooks/05b_decentralized.ipynb`.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ddnb.collectives import p2p
from ddnb.decentralized.topology import Topology
from ddnb.trace import Tracer


def mix_row(W_row: torch.Tensor, me: int, tensors: dict) -> torch.Tensor:
    """sum_j W_row[j] * tensors[j]: own term (tensors[me]) first, then the others by rank,
    each weight cast to the tensors' dtype. The one place the weighted sum is written."""
    dtype = tensors[me].dtype
    out = tensors[me] * W_row[me].to(dtype)
    for j in sorted(tensors):
        if j != me:
            out = out + tensors[j] * W_row[j].to(dtype)
    return out


class PendingGossip:
    """A posted gossip step: `finish()` waits for the neighbours' tensors and returns the mix."""

    def __init__(self, x, topo: Topology, me: int, received: dict, posted: list):
        self.x, self.topo, self.me, self.received, self.posted = x, topo, me, received, posted

    def finish(self) -> torch.Tensor:
        for p in self.posted:
            p.wait()
        return mix_row(self.topo.W[self.me], self.me, {self.me: self.x, **self.received})


def start_gossip(x: torch.Tensor, topo: Topology, group=None, tracer: Tracer | None = None,
                 name: str = "gossip") -> PendingGossip:
    """Post the sends of x (S,) to this rank's out-neighbours and the receives from its
    in-neighbours; returns a PendingGossip. x must not change until `finish()`."""
    me = p2p.group_rank(group)
    x = x.detach().contiguous()
    received = {j: torch.empty_like(x) for j in topo.in_neighbours(me)}                 # j -> (S,)
    ops = [p2p.Op("send", x, k, name=name) for k in topo.out_neighbours(me)]
    ops += [p2p.Op("recv", buf, j, name=name) for j, buf in received.items()]
    return PendingGossip(x, topo, me, received, p2p.post(ops, group, tracer))


def gossip(x: torch.Tensor, topo: Topology, group=None, tracer: Tracer | None = None,
           name: str = "gossip") -> torch.Tensor:
    """x_i <- sum_j W[i, j] x_j on every rank of `group` (one gossip step); returns the mix (S,)."""
    return start_gossip(x, topo, group, tracer, name).finish()


@torch.no_grad()
def mean_params(x: torch.Tensor, group=None) -> torch.Tensor:
    """The workers' mean x_bar (S,) on every rank: a measurement (untraced all_reduce)."""
    total = x.detach().clone()
    if p2p.group_size(group) > 1:
        dist.all_reduce(total, group=group)
    return total / p2p.group_size(group)


@torch.no_grad()
def consensus_distance(x: torch.Tensor, group=None, mean: torch.Tensor | None = None) -> float:
    """sqrt((1/N) sum_i ||x_i - x_bar||^2), the spread of the workers' parameters (Kong et
    al. 2021, "Consensus Control for Decentralized Deep Learning", ICML, Eq. 2), the same
    on every rank; `mean`: x_bar if already measured. Untraced: a measurement."""
    mean = mean_params(x, group) if mean is None else mean
    sq = ((x.detach().double() - mean.double()) ** 2).sum().reshape(1)
    if p2p.group_size(group) > 1:
        dist.all_reduce(sq, group=group)
    return float((sq / p2p.group_size(group)).sqrt())
