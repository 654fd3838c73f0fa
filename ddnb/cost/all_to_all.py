"""The alpha-beta cost of all-to-all (`ddnb.collectives.all_to_all`): each of p ranks
holds n bytes, n/p for every rank, and sends each rank its piece. Thakur, Rabenseifner &
Gropp 2005, "Optimization of collective communication operations in MPICH", IJHPCA
19(1), Sec. 3 (all-to-all), with lg = log2:

    pairwise exchange (p-1 rounds, one chunk each)      (p-1) alpha + (p-1)/p n beta
    Bruck et al. 1997 (ceil(lg p) rounds)               ceil(lg p) alpha + B beta

where B = n/p · Σ_k #{0 <= i < p : bit k of i is set}, the chunks whose distance has bit
k set all moving in round k. B = lg p · n/2 when p is a power of two, Thakur et al.'s
ceil(lg p) n/2 beta, and less otherwise (p = 3: 2n/3, not n). Thakur et al. write the
pairwise exchange as (p-1) alpha + n beta, counting the chunk a rank keeps as sent; a
rank's own chunk never leaves it, so here it is (p-1)/p n. Both are exactly the bytes
the from-scratch versions send, which tests/test_all_to_all.py checks against their
traces. Taught in `notebooks/03_collectives.ipynb`.
"""
from __future__ import annotations

from ddnb._checks import Checks
from ddnb.cost.alpha_beta import _ceil_lg

ALLTOALL_ALGORITHMS = ("pairwise", "bruck")


def _check(algorithm, nbytes, world_size, **more) -> None:
    with Checks("all-to-all cost") as check:
        check.choice("algorithm", algorithm, ALLTOALL_ALGORITHMS)
        check.number("nbytes", nbytes, min=0)
        check.integer("world_size", world_size, min=1)
        for name, value in more.items():
            check.number(name, value, min=0)


def _bruck_chunks(p: int) -> int:
    """Σ_k #{0 <= i < p : bit k of i is set}: the chunks one rank sends in Bruck's rounds."""
    total = 0
    for k in range(_ceil_lg(p)):
        low, period = 1 << k, 2 << k
        total += p // period * low + max(0, p % period - low)
    return total


def alltoall_bytes_per_rank(algorithm: str, nbytes: float, world_size: int) -> list[float]:
    """Bytes each rank sends in one all-to-all of `nbytes` bytes per rank (nbytes/p to
    each rank), in rank order (the same on every rank): (p-1)/p n for "pairwise",
    n/p · `_bruck_chunks(p)` for "bruck".

    >>> alltoall_bytes_per_rank("bruck", 4096, 4)   # 2 rounds of 2 chunks of 1 KiB
    [4096.0, 4096.0, 4096.0, 4096.0]
    """
    _check(algorithm, nbytes, world_size)
    n, p = float(nbytes), world_size
    chunks = p - 1 if algorithm == "pairwise" else _bruck_chunks(p)
    return [chunks * n / p] * p


def alltoall_time(algorithm: str, nbytes: float, world_size: int, alpha: float, beta: float) -> float:
    """Predicted seconds of one all-to-all of `nbytes` bytes per rank on `world_size`
    ranks (alpha: seconds per message, beta: seconds per byte): (p-1) alpha + (p-1)/p n
    beta for "pairwise", ceil(lg p) alpha + B beta for "bruck" (the module's docstring).
    Every rank sends and receives one message per round, all links busy at once: the
    `ddnb.bench.links.sendrecv` link, not the ping-pong one.

    >>> alltoall_time("pairwise", 1e6, 4, alpha=1e-5, beta=1e-9)   # 3e-5 + 7.5e-4
    0.00078
    """
    _check(algorithm, nbytes, world_size, alpha=alpha, beta=beta)
    p = world_size
    rounds = p - 1 if algorithm == "pairwise" else _ceil_lg(p)
    return rounds * alpha + alltoall_bytes_per_rank(algorithm, nbytes, p)[0] * beta
