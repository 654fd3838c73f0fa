"""Checkers for the decentralized chapter (05b): the learner's gossip step run on real
processes against W X and against the bytes it must send (x to each out-neighbour, Lian
et al. 2017), and two predictions (the spectral gap of a ring, the bytes of D-PSGD on a
ring against a ring all-reduce) against the formula and the measurement. While the
gossip step runs, the collectives and ddnb's own gossip are refused on the ranks
(`ddnb.exercises.guard`): an all-reduce gives the mean, not a step of W.
Taught in `notebooks/05b_decentralized.ipynb`.
"""
from __future__ import annotations

import math

import torch

from ddnb._checks import Checks, is_number
from ddnb.exercises import worlds
from ddnb.exercises.core import compare, passed, run_on_ranks
from ddnb.exercises.guard import ship


def _rank_input(rank: int, numel: int) -> torch.Tensor:
    """(numel,) float64, distinct per rank and element: 10·(rank+1) + index."""
    return torch.arange(numel, dtype=torch.float64) + 10.0 * (rank + 1)


WHY = "exchange x with the neighbours with isend/irecv (or batch_isend_irecv), that is the exercise"


def _run_gossip(blob, name: str, numel: int):
    """On a rank: the learner's gossip step, every collective and ddnb's gossip refused;
    (what it returned, bytes sent per destination)."""
    import torch.distributed as dist

    from ddnb.decentralized import topology
    from ddnb.exercises.guard import land, refuse_collectives

    topo = topology(name, dist.get_world_size())
    x = _rank_input(dist.get_rank(), numel)
    with refuse_collectives(why=WHY) as wire:
        out = land(blob)(x.clone(), topo.W)
    return out, wire.sent_to


def diagnose_gossip(got, x, mean, expected, W, rank) -> str:
    """What a wrong gossip result usually means (the hint of `check_gossip_step`)."""
    if torch.allclose(got, x):
        return f"rank {rank} returned its own x unchanged: return sum_j W[{rank}, j] * x_j"
    if torch.allclose(got, mean):
        return "every rank holds the exact mean: that is an all-reduce (W = J), not one step of W"
    row_t = W[:, rank]
    if not torch.allclose(row_t, W[rank]):
        return (f"weights look transposed? rank {rank} must weigh what it receives from j by W[{rank}, j] "
                f"(its row), not W[j, {rank}]")
    return "the weighted sum is wrong: is your own term W[rank, rank] * x included, and each neighbour's once?"


def check_gossip_step(fn, world_size: int | None = None, topologies=("ring", "exponential", "torus"),
                      numel: int = 7, timeout: float = 30, world_sizes=(4, 3)) -> str:
    """Run `fn(x, W)` (x: this rank's (numel,) float64 tensor, W: (N, N) float64) on real
    processes for each topology, on two world sizes (`world_sizes`, or `world_size` and a
    second one, `ddnb.exercises.worlds`), and compare what each rank returns with row
    `rank` of W X (Lian et al. 2017). fn exchanges with its neighbours point to point:
    every torch.distributed collective and ddnb.decentralized's gossip are refused
    (`ddnb.exercises.guard`), and each rank must send its x, S bytes, to each of its
    out-neighbours (k != rank with W[k, rank] > 0) and to no one else."""
    with Checks("check_gossip_step") as check:
        check.rule(callable(fn), f"fn={fn!r}: need a function fn(x, W) returning the mixed x")
        ns = worlds.world_sizes(check, world_size, world_sizes, min_world=2)
        check.integer("numel", numel, min=1)
    from ddnb.decentralized import topology

    blob, S = ship(fn), 8 * numel
    for n in ns:
        for name in topologies:
            got = run_on_ranks(_run_gossip, n, blob, name, numel, what=getattr(fn, "__name__", "fn"),
                               timeout=timeout)
            W = topology(name, n).W
            X = torch.stack([_rank_input(r, numel) for r in range(n)])     # (N, numel)
            expected, where = W @ X, f"{n}-rank gossip on the {name}"
            for rank, (g, _) in enumerate(got):
                if not isinstance(g, torch.Tensor) or g.shape != expected[rank].shape:
                    compare(g, expected[rank], rank=rank, name=where)
                g = g.double()
                hint = "" if torch.allclose(g, expected[rank]) else diagnose_gossip(g, X[rank], X.mean(0),
                                                                                     expected[rank], W, rank)
                compare(g, expected[rank], rank=rank, name=where, hint=hint)
            for rank, (_, sent_to) in enumerate(got):
                outs = [k for k in range(n) if k != rank and W[k, rank] > 0]
                want = {k: S for k in outs}
                if {k: b for k, b in sent_to.items() if b} != want:
                    raise AssertionError(
                        f"{where}: the values are right, but rank {rank} sent {dict(sent_to)} bytes per "
                        f"destination; one gossip step sends x ({S} bytes) once to each out-neighbour {outs}: "
                        f"{len(outs)}·S = {len(outs) * S} bytes")
    return passed("check_gossip_step", f"every rank holds its row of W X on {worlds.in_words(ns)}, "
                                       f"topologies {list(topologies)}, S bytes to each out-neighbour")


def check_spectral_gap(predicted, n: int = 8) -> str:
    """Your predicted spectral gap 1 - |lambda_2| of the ring of n ranks with weights 1/3
    (self and both neighbours), within 1e-3 of the eigenvalues."""
    from ddnb.decentralized import ring

    gap = ring(n).spectral_gap
    if not is_number(predicted):
        raise AssertionError(f"predicted={predicted!r}: write a number")
    if abs(predicted - gap) > 1e-3:
        lam2 = (1 + 2 * math.cos(2 * math.pi / n)) / 3
        hint = (f"the ring is circulant: its eigenvalues are (1 + 2 cos(2 pi k / {n})) / 3, k = 0..{n - 1}; "
                f"k = 0 gives 1, k = 1 gives lambda_2 = {lam2:.4f}")
        if abs(predicted - (1 - 1 / 3)) < 1e-3 or abs(predicted - lam2) < 1e-3:
            hint += "; the gap is 1 - |lambda_2|, and lambda_2 comes from k = 1 (the smoothest non-constant mode)"
        raise AssertionError(f"spectral gap of the ring of {n}: expected {gap:.4f}, got {predicted}. {hint}")
    return passed("check_spectral_gap", f"ring of {n}: 1 - |lambda_2| = {gap:.4f}")


def check_bytes_prediction(dpsgd_ring: float, allreduce_ring: float, n: int, numel: int,
                           measured: dict | None = None) -> str:
    """Your predicted bytes a worker *sends* per step with D-PSGD on a ring (one gossip
    step) and with a ring all-reduce, for n workers and numel float32 parameters, against
    the formulas (within 1 %) and, if given, `measured` {"dpsgd": bytes, "allreduce": bytes}
    per worker per step from the trace."""
    s = 4 * numel
    expected = {"dpsgd": 2 * s if n > 2 else (n - 1) * s, "allreduce": 2 * (n - 1) / n * s}
    for key, got in (("dpsgd", dpsgd_ring), ("allreduce", allreduce_ring)):
        if not is_number(got):
            raise AssertionError(f"{key}={got!r}: write a number of bytes")
        if abs(got - expected[key]) > 0.01 * expected[key]:
            hints = {"dpsgd": "a ring worker sends its whole vector (S = 4 * numel bytes) to each of its 2 neighbours",
                     "allreduce": "a ring all-reduce sends N-1 chunks of S/N in the reduce-scatter and N-1 again "
                                  "in the all-gather"}
            if key == "dpsgd" and abs(got - s) < 0.01 * s:
                hints["dpsgd"] += ": you counted one neighbour"
            raise AssertionError(f"{key} bytes per worker per step: expected {expected[key]:.0f}, got {got}. "
                                 f"{hints[key]}")
    detail = f"D-PSGD ring {expected['dpsgd']:.0f} B, ring all-reduce {expected['allreduce']:.0f} B per step"
    if measured:
        for key in ("dpsgd", "allreduce"):
            if abs(measured[key] - expected[key]) > 0.01 * expected[key]:
                raise AssertionError(f"measured {key} {measured[key]:.0f} B per step differs from the formula "
                                     f"{expected[key]:.0f} B")
        detail += " (the trace agrees)"
    return passed("check_bytes_prediction", detail)
