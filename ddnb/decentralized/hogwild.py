"""Hogwild!: several processes update one parameter vector in shared memory, without any
lock (Recht, Re, Wright & Niu 2011, "Hogwild!: A Lock-Free Approach to Parallelizing
Stochastic Gradient Descent", NeurIPS, Algorithm 1). It works when each update touches
few coordinates (a sparse problem): two updates then rarely touch the same coordinate,
and when they do, one overwrites part of the other, which the paper shows costs little.

    data = sparse_logistic(examples=4000, dim=1000, nnz=10)
    out = hogwild(data, processes=2, steps=2000, lr=0.5)   # ddnb.bench.hogwild: {"w", "conflict_rate", ...}

The problem: sparse logistic regression, example e having `nnz` non-zero features
(indices (E, nnz), values (E, nnz)) and a label y in {-1, +1}; the step on example e is

    w[idx_e] <- w[idx_e] + lr * y_e * sigmoid(-y_e <w[idx_e], v_e>) * v_e     (touches nnz coordinates)

Each process is a real process (`torch.multiprocessing`, spawn: `ddnb.bench.hogwild.hogwild`
starts them, each runs `_process`), w is a tensor after `share_memory_()`, and the update
is an in-place `index_add_` on it: no lock, no message.
**Conflict rate**: a second shared tensor counts writes per coordinate; a process reads
the counts of its nnz coordinates before it reads w and again just before it writes, and
an update is a conflict when another process wrote one of them in between (its read of w
was stale there). The counts are updated lock-free too, so the measure is itself racy
(an undercount, never an invention). Expect the rate to grow with nnz / dim (the chance
that two concurrent updates overlap). With one process the result is exactly serial SGD
(`serial_sgd`), bit for bit. Taught in `notebooks/05b_decentralized.ipynb`.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from ddnb._checks import Checks


class SparseData(NamedTuple):
    """Sparse examples: indices (E, nnz) int64 and values (E, nnz) float32 of the non-zero
    features, labels y (E,) in {-1, +1} float32; dim features in all."""

    indices: torch.Tensor
    values: torch.Tensor
    y: torch.Tensor
    dim: int


def sparse_logistic(examples: int = 4000, dim: int = 1000, nnz: int = 10, seed: int = 0) -> SparseData:
    """Examples with `nnz` distinct random features each, labelled by a random true w."""
    with Checks("sparse_logistic") as check:
        if check.positive_ints(examples=examples, dim=dim, nnz=nnz):
            check.rule(nnz <= dim, f"nnz={nnz} > dim={dim}: an example cannot have more features than there are")
    g = torch.Generator().manual_seed(seed)
    indices = torch.rand(examples, dim, generator=g).argsort(1)[:, :nnz]           # (E, nnz)
    values = torch.randn(examples, nnz, generator=g)                               # (E, nnz)
    w_true = torch.randn(dim, generator=g)                                         # (dim,)
    y = torch.sign((w_true[indices] * values).sum(1) + 1e-6)                       # (E,)
    return SparseData(indices, values, y, dim)


def loss(w: torch.Tensor, data: SparseData) -> float:
    """Mean logistic loss log(1 + exp(-y <w, x>)) over the examples."""
    margin = data.y * (w[data.indices] * data.values).sum(1)                       # (E,)
    return float(torch.nn.functional.softplus(-margin).mean())


def _order(data: SparseData, process: int, steps: int, seed: int) -> torch.Tensor:
    """The examples process `process` visits, in order (steps,)."""
    g = torch.Generator().manual_seed(1_000_003 * seed + process)
    return torch.randint(len(data.y), (steps,), generator=g)


def _step(w, counts, data, e: int, lr: float) -> bool:
    """One lock-free update of w on example e; True if another process wrote one of its
    coordinates between this step's read and its write (a conflict)."""
    idx, v, y = data.indices[e], data.values[e], data.y[e]                         # (nnz,), (nnz,), ()
    seen = counts[idx].clone()
    coef = lr * y * torch.sigmoid(-y * (w[idx] * v).sum())
    conflict = bool((counts[idx] != seen).any())
    w.index_add_(0, idx, coef * v)
    counts.index_add_(0, idx, torch.ones_like(seen))
    return conflict


def _process(rank, w, counts, stats, data, steps, lr, seed, start):
    torch.set_num_threads(1)
    order = _order(data, rank, steps, seed).tolist()
    start.wait()                        # every process imported and ready: they overlap for real
    conflicts = 0
    for e in order:
        conflicts += _step(w, counts, data, e, lr)
    stats[rank] = torch.tensor([steps, conflicts], dtype=torch.int64)


def serial_sgd(data: SparseData, steps: int = 1000, lr: float = 0.5, seed: int = 0, process: int = 0) -> torch.Tensor:
    """The same steps in this process, one after the other: Hogwild! with one process, exactly."""
    w, counts = torch.zeros(data.dim), torch.zeros(data.dim, dtype=torch.int64)
    for e in _order(data, process, steps, seed).tolist():
        _step(w, counts, data, e, lr)
    return w
