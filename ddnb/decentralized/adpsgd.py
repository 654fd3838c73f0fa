"""AD-PSGD: asynchronous decentralized parallel SGD, pairwise averaging (Lian et al. 2018,
"Asynchronous Decentralized Parallel Stochastic Gradient Descent", ICML, Algorithm 1):

    each worker i, over and over:
        read x^_i <- x_i; compute g_i(x^_i)            the gradient at the value it read
        pick a neighbour j; x_i, x_j <- (x_i + x_j)/2  atomically, both ends
        x_i <- x_i - lr g_i(x^_i)

What "asynchronous" means here, on gloo. The paper's workers run free: a fast worker
averages with whichever neighbour it picks, that neighbour's state being updated by a
helper thread while it computes. Here the pairs of each step come from a deterministic
schedule instead (`matching`: a random maximal matching of the topology's edges, seeded
by (seed, step), which every rank computes alike), and a step's averaging is one message
each way between the two partners, posted before the gradient and completed after it (so
the averaging overlaps the compute, and the gradient is taken at x^_i, the value before
the averaging, as in the paper). So there is **no global barrier**: a step waits for
one partner, not for all N - 1 others as an all-reduce does; a straggler holds up only its
partner of that step (and, one step later, that partner's next partner: the delay spreads
along the matchings, not at once). What is *not* reproduced: every worker takes the same
number of steps (a fast worker cannot run ahead), and an unmatched worker takes a plain
SGD step. With one worker it is SGD. Bytes per matched step: S sent, S received.
Taught in `notebooks/05b_decentralized.ipynb`.
"""
from __future__ import annotations

import torch

from ddnb.collectives import p2p
from ddnb.decentralized.config import DecentralizedConfig
from ddnb.decentralized.topology import Topology
from ddnb.decentralized.worker import Worker


def matching(topo: Topology, step: int, seed: int = 0) -> dict[int, int]:
    """{rank: partner} for `step`: the topology's undirected edges in a random order seeded
    by (seed, step), taken greedily while both ends are free (a maximal matching)."""
    edges = topo.edges()
    order = torch.randperm(len(edges), generator=torch.Generator().manual_seed(1_000_003 * seed + step))
    partner: dict[int, int] = {}
    for e in order.tolist():
        i, j = edges[e]
        if i not in partner and j not in partner:
            partner[i], partner[j] = j, i
    return partner


def train_adpsgd(config: DecentralizedConfig, model_fn, dataset, test=None, group=None, tracer=None,
                 loss_fn=None) -> dict:
    """Call on every rank: `config.steps` AD-PSGD steps on the pairs of `matching`;
    `Worker` stats, plus "partners" (this rank's partner per step, None when unmatched)."""
    w = Worker("adpsgd", config, model_fn, dataset, test, group, tracer, loss_fn)
    x, partners = w.initial(), []                                        # (S,)
    w.measure(0, x)
    for step in range(config.steps):
        j = matching(w.topo, step, config.seed).get(w.rank)
        partners.append(j)
        if j is not None:
            theirs = torch.empty_like(x)                                 # (S,) x_j
            posted = p2p.post([p2p.Op("send", x, j, name="pair"), p2p.Op("recv", theirs, j, name="pair")],
                              group, w.tracer)
        _, g = w.gradient(x, step)                                       # at x^ = x before averaging
        if j is not None:
            for p in posted:
                p.wait()
            x = 0.5 * x + 0.5 * theirs                                   # the same bits on both ends
        x = x - config.lr * g
        w.tick()
        w.measure(step + 1, x)
    stats = w.finish(x)
    stats["partners"] = partners
    return stats
