"""Every decentralized method, simulated in one process: N workers' parameters as the rows
of X (N, S), the same batches, the same gradients, the same mixing arithmetic
(`gossip.mix_row`), so a run on real processes must match it to rounding (tests: 1e-6).

    X = simulate("dpsgd", config, model_fn, train, n=4)        # (4, S)
    x = simulate("sgd", config, model_fn, train, n=4)[0]       # synchronous SGD on the N batches

"sgd" is the single-process reference of synchronous data-parallel SGD: one model, the
step x <- x - lr mean_i g_i(x) over the N workers' batches (every row of X equal).
Taught in `notebooks/05b_decentralized.ipynb` (each method is checked against it there).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ddnb.data import Dataset
from ddnb.decentralized.adpsgd import matching
from ddnb.decentralized.config import DecentralizedConfig
from ddnb.decentralized.gossip import mix_row
from ddnb.decentralized.local_sgd import averages_after
from ddnb.decentralized.topology import topology
from ddnb.models import flat_params
from ddnb.parameter_server.worker import forward_backward, worker_batch

SIMULATED = ("sgd", "dpsgd", "local_sgd", "easgd", "adpsgd")


def _mix(W, X: list) -> list:
    return [mix_row(W[i], i, {j: X[j] for j in range(len(X)) if j == i or W[i, j] > 0}) for i in range(len(X))]


def simulate(method: str, config: DecentralizedConfig, model_fn, dataset, n: int, loss_fn=None) -> torch.Tensor:
    """The N workers' parameters (N, S) after config.steps steps of `method` (SIMULATED)."""
    if method not in SIMULATED:
        raise ValueError(f"method={method!r} is not one of {SIMULATED}")
    dataset = dataset if isinstance(dataset, Dataset) else Dataset(*dataset)
    config.validate(n, len(dataset))
    loss_fn, model = loss_fn or F.cross_entropy, model_fn()
    W, lr = topology(config.topology, n).W, config.lr
    X = [flat_params(model).clone() for _ in range(n)]                   # N x (S,)
    center, when = X[0].clone(), set(averages_after(config))

    def grad(i, x, t):
        xb, yb = worker_batch(dataset, i, n, config.batch_size, t, config.seed)
        return forward_backward(model, x, xb, yb, loss_fn)[1]            # (S,)

    for t in range(config.steps):
        G = [grad(i, X[i], t) for i in range(n)]
        if method == "sgd":
            g = G[0]
            for gi in G[1:]:
                g = g + gi
            X = [X[0] - lr * (g / n)] * n
        elif method == "dpsgd" and config.order == "lian":
            M = X
            for _ in range(config.gossip_steps):
                M = _mix(W, M)
            X = [M[i] - lr * G[i] for i in range(n)]
        elif method == "dpsgd":
            X = [X[i] - lr * G[i] for i in range(n)]
            for _ in range(config.gossip_steps):
                X = _mix(W, X)
        elif method == "local_sgd":
            X = [X[i] - lr * G[i] for i in range(n)]
            if t + 1 in when:
                X = [torch.stack(X).mean(0)] * n
        elif method == "easgd":
            if t % config.local_steps == 0:
                a = config.elastic(n)
                D = [a * (X[i] - center) for i in range(n)]
                total = D[0]
                for d in D[1:]:
                    total = total + d
                center = center + total
                X = [X[i] - lr * G[i] - D[i] for i in range(n)]
            else:
                X = [X[i] - lr * G[i] for i in range(n)]
        else:   # adpsgd
            pairs = matching(topology(config.topology, n), t, config.seed)
            X = [(0.5 * X[i] + 0.5 * X[pairs[i]]) if i in pairs else X[i] for i in range(n)]
            X = [X[i] - lr * G[i] for i in range(n)]
    return torch.stack(X)
