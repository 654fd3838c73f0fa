"""Hogwild! run for real: `hogwild` starts the processes (`torch.multiprocessing`, spawn)
that take lock-free steps on one parameter vector in shared memory, each running
`ddnb.decentralized.hogwild._process` (the problem, the step and the conflict count are
there, with the paper: Recht et al. 2011, Algorithm 1), and gathers the result.

    data = sparse_logistic(examples=4000, dim=1000, nnz=10)   # ddnb.decentralized.hogwild
    out = hogwild(data, processes=2, steps=2000, lr=0.5)       # {"w", "conflict_rate", "loss", ...}

Taught in `notebooks/05b_decentralized.ipynb`.
"""
from __future__ import annotations

import torch

from ddnb._checks import Checks
from ddnb.decentralized.hogwild import SparseData, _process, loss


def hogwild(data: SparseData, processes: int = 2, steps: int = 1000, lr: float = 0.5, seed: int = 0,
            timeout: float = 120) -> dict:
    """Run `processes` real processes, each taking `steps` lock-free steps on the shared w.
    Returns {"w" (dim,), "loss_before", "loss", "updates", "conflicts", "conflict_rate",
    "nnz", "dim", "processes"}."""
    with Checks("hogwild") as check:
        check.positive_ints(processes=processes, steps=steps)
        check.number("lr", lr, positive=True)
    import torch.multiprocessing as mp

    from ddnb.runtime.world import _main_not_reimported

    w = torch.zeros(data.dim).share_memory_()                                      # (dim,) the parameters
    counts = torch.zeros(data.dim, dtype=torch.int64).share_memory_()              # (dim,) writes so far
    stats = torch.zeros(processes, 2, dtype=torch.int64).share_memory_()           # (P, 2) steps, conflicts
    before = loss(w, data)
    ctx = mp.get_context("spawn")
    start = ctx.Barrier(processes)
    with _main_not_reimported():
        procs = [ctx.Process(target=_process, args=(r, w, counts, stats, data, steps, lr, seed, start), daemon=True)
                 for r in range(processes)]
        for p in procs:
            p.start()
    for p in procs:
        p.join(timeout)
    bad = [r for r, p in enumerate(procs) if p.exitcode != 0]
    for p in procs:
        if p.is_alive():
            p.kill()
    if bad:
        raise RuntimeError(f"hogwild: process(es) {bad} failed or did not finish within {timeout} s")
    updates, conflicts = (int(v) for v in stats.sum(0))
    return {"w": w.clone(), "loss_before": before, "loss": loss(w, data), "updates": updates,
            "conflicts": conflicts, "conflict_rate": conflicts / updates, "nnz": data.indices.shape[1],
            "dim": data.dim, "processes": processes}
