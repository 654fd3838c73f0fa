"""The alpha-beta-gamma cost model of all-reduce, and how to measure its parameters.

A message of n bytes between two ranks costs  t = alpha + n * beta  (latency alpha in
seconds, inverse bandwidth beta in seconds per byte), and reducing n bytes locally costs
n * gamma. Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication
Operations in MPICH", IJHPCA 19(1), 2005 (Section 4, the all-reduce costs) give the time
of each algorithm on p ranks; with lg = log2:

    naive (gather to a root, reduce, broadcast from it)   2(p-1)(alpha + n beta) + (p-1) n gamma
    binomial tree (reduce, then broadcast)                 2 ceil(lg p)(alpha + n beta) + ceil(lg p) n gamma
    ring (reduce-scatter, then all-gather)                 2(p-1) alpha + 2(p-1)/p n beta + (p-1)/p n gamma
    recursive halving-doubling (Rabenseifner)              2 lg p alpha + 2(p-1)/p n beta + (p-1)/p n gamma

The model assumes every rank can send and receive one message at a time, at full speed,
and that messages between disjoint pairs do not slow each other down. `fit_alpha_beta`
fits alpha and beta to measured times; the measurements themselves (`pingpong` on one
link alone, `sendrecv` with every link busy at once, `measure_gamma`, a local add) run
on processes, so they live in `ddnb.bench.links`: nothing here starts or talks to one.
Taught in `notebooks/05_allreduce.ipynb`; `python -m ddnb.bench allreduce --fit`
compares the model with measured times.
"""
from __future__ import annotations

import math

from ddnb._checks import Checks, is_number

ALGORITHMS = ("naive", "tree", "ring", "halving_doubling")


def _check(check: Checks, algorithm: str, nbytes, world_size) -> None:
    """An algorithm of ALGORITHMS, nbytes >= 0 and world_size >= 1."""
    check.rule(algorithm in ALGORITHMS, f"unknown all-reduce algorithm {algorithm!r}; known: {', '.join(ALGORITHMS)}")
    check.number("nbytes", nbytes, min=0)
    check.integer("world_size", world_size, min=1)


def _ceil_lg(p: int) -> int:
    return (p - 1).bit_length()  # ceil(log2 p) for p >= 1, exactly (no float rounding)


def allreduce_time(algorithm: str, nbytes: float, world_size: int, alpha: float, beta: float,
                   gamma: float = 0.0) -> float:
    """Predicted seconds of one all-reduce of `nbytes` bytes per rank on `world_size` ranks.

    alpha: seconds per message; beta: seconds per byte sent; gamma: seconds per byte
    reduced. Equations of Thakur et al. 2005, Section 4 (n = nbytes, p = world_size):

    - "naive": every rank sends its vector to rank 0, which reduces and sends the result
      back: 2(p-1)(alpha + n beta) + (p-1) n gamma. Assumes the root's link serializes:
      it receives its p-1 messages one after another, then sends p-1 (the linear-time
      gather/scatter of Section 4 applied to whole vectors).
    - "tree": binomial-tree reduce, ceil(lg p)(alpha + n beta + n gamma) (Section 4.4),
      then binomial-tree broadcast, ceil(lg p)(alpha + n beta) (Section 4.1):
      2 ceil(lg p)(alpha + n beta) + ceil(lg p) n gamma.
    - "ring": reduce-scatter then all-gather around a ring of p ranks, in chunks of n/p
      (Section 4.5, and Patarasuk & Yuan 2009):
      2(p-1) alpha + 2(p-1)/p n beta + (p-1)/p n gamma.
    - "halving_doubling": Rabenseifner's algorithm, a reduce-scatter by recursive vector
      halving and distance doubling, then an all-gather by recursive vector doubling and
      distance halving (Section 4.5): 2 lg p alpha + 2(p-1)/p n beta + (p-1)/p n gamma.
      When p is not a power of two, with p' = 2^floor(lg p), the p - p' extra ranks first
      fold their vector into a partner (alpha + n beta + n gamma) and get the result back
      at the end (alpha + n beta), as MPICH does; the total is then
      2 lg p' alpha + 2(p'-1)/p' n beta + (p'-1)/p' n gamma + 2(alpha + n beta) + n gamma.

    >>> allreduce_time("ring", 1e6, 4, alpha=1e-5, beta=1e-9)   # 6e-5 + 1.5e-3
    0.00156
    """
    with Checks("allreduce_time") as check:
        _check(check, algorithm, nbytes, world_size)
        for name, value in (("alpha", alpha), ("beta", beta), ("gamma", gamma)):
            check.number(name, value, min=0)
    n, p = float(nbytes), world_size
    if p == 1:
        return 0.0
    if algorithm == "naive":
        return 2 * (p - 1) * (alpha + n * beta) + (p - 1) * n * gamma
    if algorithm == "tree":
        steps = _ceil_lg(p)
        return 2 * steps * (alpha + n * beta) + steps * n * gamma
    if algorithm == "ring":
        return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n * beta + (p - 1) / p * n * gamma
    q = 1 << (p.bit_length() - 1)  # p' = the largest power of two <= p
    t = 2 * (q.bit_length() - 1) * alpha + 2 * (q - 1) / q * n * beta + (q - 1) / q * n * gamma
    if q != p:
        t += 2 * (alpha + n * beta) + n * gamma
    return t


def allreduce_bytes_per_rank(algorithm: str, nbytes: float, world_size: int) -> list[float]:
    """Bytes each rank sends during one all-reduce of `nbytes` bytes, in rank order.

    - "naive": rank 0 (the root) sends (p-1) n, every other rank n.
    - "tree": binomial tree rooted at 0: every rank but 0 sends n to its parent in the
      reduce, and n to each of its children in the broadcast (rank r's children are
      r + 2^k for 2^k below r's lowest set bit, and below p).
    - "ring": 2(p-1)/p n on every rank (p-1 chunks of n/p in each phase).
    - "halving_doubling": 2(p'-1)/p' n on every rank of the power-of-two core
      (n/2 + n/4 + ... + n/p' in each phase). With p' < p and rem = p - p', the first
      2 rem ranks pair up as `ddnb.collectives.halving_doubling` does: each odd one sends
      its vector (n) to the even one below it and sits out; the even one also sends it
      the result at the end (n).
    The sum over ranks is the total traffic: 2(p-1) n for naive and tree, 2(p-1) n for
    the ring and for halving-doubling on a power of two.
    """
    with Checks("allreduce_bytes_per_rank") as check:
        _check(check, algorithm, nbytes, world_size)
    n, p = float(nbytes), world_size
    if p == 1:
        return [0.0]
    if algorithm == "naive":
        return [(p - 1) * n] + [n] * (p - 1)
    if algorithm == "ring":
        return [2 * (p - 1) / p * n] * p
    if algorithm == "tree":
        out = []
        for r in range(p):
            low = r & -r if r else 1 << _ceil_lg(p)  # r's lowest set bit (the root: above all)
            children = sum(1 for k in range(_ceil_lg(p)) if (1 << k) < low and r + (1 << k) < p)
            out.append((n if r else 0.0) + children * n)
        return out
    q = 1 << (p.bit_length() - 1)
    core = 2 * (q - 1) / q * n
    rem = p - q
    return [(n if r % 2 else core + n) if r < 2 * rem else core for r in range(p)]


def fit_alpha_beta(sizes_bytes, times_s, relative: bool = True) -> tuple[float, float]:
    """(alpha, beta) >= 0 that best fit  t = alpha + n beta  to measured (n, t) pairs.

    Least squares, solved in closed form (the 2x2 normal equations). relative=True
    (default) weights each point by 1/t^2, i.e. minimizes the squared *relative* errors,
    so that a 4 KB point counts as much as a 64 MB one (plain least squares would let the
    largest sizes decide alpha). Non-negativity: if the unconstrained solution has a
    negative alpha (or beta), that one is set to 0 and the other refit alone, which is
    the exact non-negative least-squares solution for two unknowns. Exact data are
    recovered exactly.
    """
    ns, ts = list(sizes_bytes), list(times_s)
    if len(ns) != len(ts) or len(ns) < 2:
        raise ValueError(f"need >= 2 (size, time) pairs of equal length, got {len(ns)} sizes and {len(ts)} times")
    bad = [f"sizes_bytes[{i}]={n!r}" for i, n in enumerate(ns) if not (is_number(n) and n >= 0)] + \
          [f"times_s[{i}]={t!r}" for i, t in enumerate(ts) if not (is_number(t) and t > 0)]
    if bad:
        raise ValueError(f"need finite sizes >= 0 and times > 0, got {', '.join(bad)} "
                         f"(sizes_bytes={ns}, times_s={ts})")
    ns, ts = [float(n) for n in ns], [float(t) for t in ts]
    if len(set(ns)) < 2:
        raise ValueError(f"need at least two different sizes to separate alpha from beta, got {sorted(set(ns))}")
    w = [1.0 / t**2 if relative else 1.0 for t in ts]
    sw = sum(w)
    swn = sum(wi * n for wi, n in zip(w, ns))
    swnn = sum(wi * n * n for wi, n in zip(w, ns))
    swt = sum(wi * t for wi, t in zip(w, ts))
    swnt = sum(wi * n * t for wi, n, t in zip(w, ns, ts))
    det = sw * swnn - swn * swn
    if not (math.isfinite(det) and det > 0 and math.isfinite(swnt)):   # 1/t^2 or n^2 out of float range
        raise ValueError(f"cannot fit sizes_bytes={ns}, times_s={ts}: their weighted sums leave float range "
                         f"(times near 0 with relative=True, or sizes near 1e150)")
    alpha = (swnn * swt - swn * swnt) / det
    beta = (sw * swnt - swn * swt) / det
    if alpha < 0:  # t = n beta alone
        alpha, beta = 0.0, max(swnt / swnn, 0.0)
    elif beta < 0:  # t = alpha alone
        alpha, beta = swt / sw, 0.0
    return alpha, beta
