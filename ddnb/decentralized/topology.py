"""Who talks to whom in decentralized training, and with what weights: the mixing matrix W.

A gossip step replaces each worker's parameters by a weighted average of its neighbours'
(and its own): x_i <- sum_j W[i, j] x_j, or for all N workers at once X <- W X with X
(N, S). Rank i *receives* from its in-neighbours {j != i : W[i, j] > 0} and *sends* to
its out-neighbours {k != i : W[k, i] > 0}. W must be

    non-negative and doubly stochastic   rows sum to 1 (a weighted average) and columns sum
                                         to 1 (the average over workers is preserved:
                                         1^T W = 1^T), Lian et al. 2017, Assumption 1;
    connected                            every worker reaches every other one through edges
                                         W[i, j] > 0, else some never agree.

Then W^t -> J = (1/N) 1 1^T, at a rate set by the second-largest eigenvalue modulus
|lambda_2|: the consensus error shrinks like |lambda_2|^t, and the **spectral gap**
1 - |lambda_2| is the topology's figure of merit (Boyd et al. 2006, "Randomized gossip
algorithms", IEEE Trans. Inf. Theory 52(6); Lian et al. 2017, Theorem 1, rho = |lambda_2|^2).

    ring(N)          degree 2, Metropolis-Hastings weights 1/3: gap ~ 4 pi^2 / (3 N^2)
    torus(N)         rows x cols grid with wrap-around, degree 4: gap ~ 1/N
    exponential(N)   rank i hears from i + 2^0, i + 2^1, ... (mod N), all weights
                     1/(ceil(log2 N) + 1): a directed, circulant W (Ying et al. 2021,
                     "Exponential Graph is Provably Efficient for Decentralized Deep
                     Training", NeurIPS, Sec. 3, the static exponential graph):
                     degree log2 N, gap 1 - |lambda_2| = 2/(1 + log2 N) for N a power of 2
    complete(N)      W = J: one gossip step is an exact average (all-reduce)

Undirected graphs get Metropolis-Hastings weights (Xiao & Boyd 2004, "Fast linear
iterations for distributed averaging", Sys. Control Lett. 53, Eq. (9)):
W[i, j] = 1 / (1 + max(d_i, d_j)) for an edge, W[i, i] = 1 - sum of the row: symmetric,
hence doubly stochastic, for any graph. Taught in `notebooks/05b_decentralized.ipynb`.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

from ddnb._checks import Checks, is_int

ATOL = 1e-9   # how far a row or column sum may be from 1


class Topology(NamedTuple):
    """A named mixing matrix W (N, N) float64, checked by `check_mixing` when built."""

    name: str
    W: torch.Tensor

    @property
    def n(self) -> int:
        return self.W.shape[0]

    def in_neighbours(self, i: int) -> list[int]:
        """The ranks rank i receives from: j != i with W[i, j] > 0."""
        return [j for j in range(self.n) if j != i and self.W[i, j] > 0]

    def out_neighbours(self, i: int) -> list[int]:
        """The ranks rank i sends to: k != i with W[k, i] > 0."""
        return [k for k in range(self.n) if k != i and self.W[k, i] > 0]

    def edges(self) -> list[tuple[int, int]]:
        """Undirected edges (i < j) where W[i, j] > 0 or W[j, i] > 0 (AD-PSGD's pairs)."""
        return [(i, j) for i in range(self.n) for j in range(i + 1, self.n) if self.W[i, j] > 0 or self.W[j, i] > 0]

    @property
    def spectral_gap(self) -> float:
        return spectral_gap(self.W)


def _components(W: torch.Tensor) -> list[list[int]]:
    """The strongly connected components of the graph i -> j where W[j, i] > 0 (weights
    flow from j to i), found by forward and backward reachability."""
    n, left, comps = W.shape[0], set(range(W.shape[0])), []
    adj = W > 0
    while left:
        root = min(left)
        reach = []
        for a in (adj, adj.T):
            seen, todo = {root}, [root]
            while todo:
                i = todo.pop()
                for j in range(n):
                    if a[i, j] and j not in seen:
                        seen.add(j)
                        todo.append(j)
            reach.append(seen)
        comp = sorted(reach[0] & reach[1] & left)
        comps.append(comp)
        left -= set(comp)
    return comps


def check_mixing(W, where: str = "mixing matrix", world_size: int | None = None) -> torch.Tensor:
    """W as a float64 tensor, after checking that it is square (N = world_size when given),
    non-negative, doubly stochastic and connected; one ValueError lists every rule broken."""
    W = torch.as_tensor(W, dtype=torch.float64)
    with Checks(where) as check:
        if not check.rule(W.dim() == 2 and W.shape[0] == W.shape[1] and W.shape[0] >= 1,
                          f"W has shape {tuple(W.shape)}: need a square (N, N) matrix"):
            return W
        n = W.shape[0]
        if world_size is not None:
            check.rule(n == world_size, f"W is {n}x{n} but world_size={world_size}: need one row per rank")
        if not check.rule(bool(torch.isfinite(W).all()) and bool((W >= 0).all()),
                          f"W has negative or non-finite entries (min {W.min().item():g}): weights must be >= 0"):
            return W
        rows, cols = W.sum(1), W.sum(0)
        bad_rows = [i for i in range(n) if abs(rows[i].item() - 1) > ATOL]
        bad_cols = [j for j in range(n) if abs(cols[j].item() - 1) > ATOL]
        check.rule(not bad_rows, f"W is not doubly stochastic: rows {bad_rows} sum to "
                                 f"{[round(rows[i].item(), 6) for i in bad_rows]}, need 1 (a weighted average)")
        check.rule(not bad_cols, f"W is not doubly stochastic: columns {bad_cols} sum to "
                                 f"{[round(cols[j].item(), 6) for j in bad_cols]}, need 1 (the mean over workers "
                                 f"must be preserved)")
        comps = _components(W)
        check.rule(len(comps) == 1, f"the topology is disconnected: {len(comps)} groups of ranks {comps} never "
                                    f"exchange parameters, so they never agree")
    return W


def metropolis_hastings(adjacency) -> torch.Tensor:
    """Metropolis-Hastings weights (Xiao & Boyd 2004, Eq. 9) of an undirected graph given
    as a symmetric 0/1 adjacency (N, N): W[i, j] = 1/(1 + max(d_i, d_j)) on edges,
    W[i, i] = 1 - sum_j W[i, j]. Returns W (N, N) float64, symmetric."""
    A = torch.as_tensor(adjacency, dtype=torch.float64).clone()
    A.fill_diagonal_(0)
    if not torch.equal(A, A.T):
        raise ValueError("metropolis_hastings: the adjacency must be symmetric (an undirected graph)")
    deg = A.sum(1)                                                           # (N,)
    W = A / (1 + torch.maximum(deg[:, None], deg[None, :]))                  # (N, N)
    W += torch.diag(1 - W.sum(1))
    return W


def _undirected(n: int, pairs) -> torch.Tensor:
    A = torch.zeros(n, n, dtype=torch.float64)
    for i, j in pairs:
        if i != j:
            A[i, j] = A[j, i] = 1
    return A


def ring(n: int) -> Topology:
    """Rank i averages with i - 1 and i + 1 (mod n), Metropolis-Hastings weights."""
    _check_n("ring", n)
    return Topology("ring", check_mixing(metropolis_hastings(_undirected(n, [(i, (i + 1) % n) for i in range(n)]))))


def torus_shape(n: int) -> tuple[int, int]:
    """(rows, cols) of the most square grid with rows * cols = n, rows <= cols (a prime n
    gives 1 x n: a ring)."""
    rows = max(r for r in range(1, math.isqrt(n) + 1) if n % r == 0)
    return rows, n // rows


def torus(n: int, rows: int | None = None) -> Topology:
    """A 2-D torus of rows x (n / rows) ranks (default `torus_shape`), rank r at (r // cols,
    r % cols), each averaging with its 4 grid neighbours (wrapping around), MH weights."""
    _check_n("torus", n)
    rows = torus_shape(n)[0] if rows is None else rows
    with Checks("torus") as check:
        check.rule(is_int(rows) and rows >= 1 and n % rows == 0, f"rows={rows!r} does not divide n={n}")
    cols = n // rows
    pairs = []
    for r in range(n):
        a, b = divmod(r, cols)
        pairs += [(r, ((a + 1) % rows) * cols + b), (r, a * cols + (b + 1) % cols)]
    return Topology("torus", check_mixing(metropolis_hastings(_undirected(n, pairs))))


def exponential(n: int) -> Topology:
    """The static exponential graph of Ying et al. 2021 (Sec. 3, Eq. 6): W[i, j] =
    1/(ceil(log2 n) + 1) when j = i or (j - i) mod n is a power of 2, else 0. Circulant,
    so doubly stochastic; directed (i hears from i + 2^k, sends to i - 2^k)."""
    _check_n("exponential", n)
    W = torch.zeros(n, n, dtype=torch.float64)
    tau = math.ceil(math.log2(n)) if n > 1 else 0
    for i in range(n):
        W[i, i] = 1 / (tau + 1)
        k = 1
        while k < n:
            W[i, (i + k) % n] = 1 / (tau + 1)
            k *= 2
    return Topology("exponential", check_mixing(W))


def complete(n: int) -> Topology:
    """W = J = (1/n) 1 1^T: every rank averages everyone's parameters in one step."""
    _check_n("complete", n)
    return Topology("complete", check_mixing(torch.full((n, n), 1.0 / n, dtype=torch.float64)))


def from_matrix(W, name: str = "custom", world_size: int | None = None) -> Topology:
    """A Topology of your own W, checked (`check_mixing`)."""
    return Topology(name, check_mixing(W, f"topology {name!r}", world_size))


TOPOLOGIES = {"ring": ring, "torus": torus, "exponential": exponential, "complete": complete}


def topology(name, n: int) -> Topology:
    """The topology `name` (one of TOPOLOGIES) on n ranks; a Topology passes through
    (its size checked against n); a matrix becomes `from_matrix(name, ...)`."""
    if isinstance(name, Topology):
        return from_matrix(name.W, name.name, world_size=n)
    if isinstance(name, str):
        with Checks("topology") as check:
            check.choice("topology", name, tuple(TOPOLOGIES))
        return TOPOLOGIES[name](n)
    return from_matrix(name, world_size=n)


def spectral_gap(W) -> float:
    """1 - |lambda_2|: one minus the second-largest modulus among W's eigenvalues (1 for a
    single rank). The fraction of the disagreement one gossip step removes, at worst and
    in the long run."""
    W = torch.as_tensor(W, dtype=torch.float64)
    if W.shape[0] == 1:
        return 1.0
    if torch.equal(W, W.T):
        mods = torch.linalg.eigvalsh(W).abs()
    else:
        mods = torch.linalg.eigvals(W).abs()
    mods = mods.sort(descending=True).values
    return float(1 - mods[1])


def _check_n(where: str, n) -> None:
    with Checks(where) as check:
        check.integer("n", n, min=1, why=" (ranks)")
