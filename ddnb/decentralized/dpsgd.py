"""D-PSGD: decentralized parallel SGD, every worker averaging with its neighbours only
(Lian et al. 2017, "Can Decentralized Algorithms Outperform Centralized Algorithms? A Case
Study for Decentralized Parallel Stochastic Gradient Descent", NeurIPS, Algorithm 1).

    cluster.run(train_dpsgd, DecentralizedConfig(topology="ring", steps=200), model_fn, train, test)

With X (N, S) the workers' parameters, G(X) (N, S) their stochastic gradients, each at
its own row, and W the mixing matrix (`topology.py`), one step with k gossip steps is

    order="lian"   X <- W^k X - lr G(X)          Lian et al. 2017, Alg. 1, lines 4-5: the
                                                 gossip of x_t is posted before the gradient
                                                 at x_t is computed, and overlaps it
    order="atc"    X <- W^k (X - lr G(X))        adapt then combine (Koloskova et al. 2020,
                                                 "A Unified Theory of Decentralized SGD",
                                                 ICML, Alg. 1): the local step, then the gossip

With the complete graph (W = J = 11^T / N) "atc" is all-reduce SGD exactly: every row of
J (X - lr G) is x_bar - lr mean_i g_i, the synchronous step (tests: within 1e-6). "lian"
with J is not: each worker's gradient is taken at its own x_i, which differs from x_bar
by its own last step. The mean x_bar follows SGD with gradients taken at points
that are O(lr) apart, which is why D-PSGD converges at the same rate in the end (Lian et al.
2017, Theorem 1 and Corollary 2, where the spectral gap enters only the higher-order term).

Bytes per worker per step: k · out_degree · S sent, k · in_degree · S received (ring:
2kS each way, whatever N is; exponential: k·log2(N)·S; complete: k(N-1)S, more than a ring
all-reduce's 2(N-1)/N·S). Taught in `notebooks/05b_decentralized.ipynb`.
"""
from __future__ import annotations

from ddnb.decentralized.config import DecentralizedConfig
from ddnb.decentralized.gossip import gossip, start_gossip
from ddnb.decentralized.worker import Worker


def train_dpsgd(config: DecentralizedConfig, model_fn, dataset, test=None, group=None, tracer=None,
                loss_fn=None) -> dict:
    """Call on every rank of `group` (e.g. `cluster.run(train_dpsgd, config, model_fn, train, test)`):
    `config.steps` D-PSGD steps on `config.topology`; returns the `Worker` stats."""
    w = Worker("dpsgd", config, model_fn, dataset, test, group, tracer, loss_fn)
    x, lr, k = w.initial(), config.lr, config.gossip_steps                       # (S,)
    w.measure(0, x)
    for step in range(config.steps):
        if config.order == "lian":
            pending = start_gossip(x, w.topo, group, w.tracer)      # W x, in flight ...
            _, g = w.gradient(x, step)                              # ... while g(x) is computed
            mixed = pending.finish()
            for _ in range(k - 1):
                mixed = gossip(mixed, w.topo, group, w.tracer)
            x = mixed - lr * g
        else:
            _, g = w.gradient(x, step)
            x = x - lr * g
            for _ in range(k):
                x = gossip(x, w.topo, group, w.tracer)
        w.tick()
        w.measure(step + 1, x)
    return w.finish(x)

