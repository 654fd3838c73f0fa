"""Bytes per worker per run of each method, as formulas, to set against the trace
(`Worker` stats "bytes_sent" / "bytes_received"; tests check them exactly). Payload bytes
only, S = numel · element_size bytes of parameters, N workers, T steps:

    all-reduce SGD (ring)     T · 2(N-1)/N · S          rank r exactly: 2S - |c_r| - |c_{r+1}|
    local SGD                 A · (the same)            A = len(averages_after): about T / H
    D-PSGD                    T · k · out_degree · S    received: k · in_degree · S
    AD-PSGD                   M_r · S each way          M_r: steps in which rank r is matched
    EASGD                     C · S each way            rank 0: C · (N-1) · S; C = ceil(T / tau)
    decentralized PS          T·(S - S_r) + T·(N-1)·S_r + headers, each way (`decentralized_ps_bytes`)
    central PS (04, BSP)      T · S each way            the server: T · N · S each way

(c_j: chunk j of the ring's split of the vector, `ddnb.collectives.chunk_bounds`.)
Taught in `notebooks/05b_decentralized.ipynb`.
"""
from __future__ import annotations

from ddnb.collectives import chunk_bounds
from ddnb.decentralized.adpsgd import matching
from ddnb.decentralized.config import DecentralizedConfig
from ddnb.decentralized.decentralized_ps import decentralized_ps_bytes
from ddnb.decentralized.easgd import communications
from ddnb.decentralized.local_sgd import averages_after
from ddnb.decentralized.topology import topology

METHODS = ("allreduce_sgd", "local_sgd", "dpsgd", "adpsgd", "easgd", "decentralized_ps")


def ring_allreduce_bytes(numel: int, n: int, element_size: int = 4) -> list[dict]:
    """Per rank, the bytes one ring all-reduce (`ddnb.collectives.ring`) sends and receives:
    rank r sends N-1 chunks in each phase, all but c_r in one and all but c_{r+1} in the
    other; it receives what rank r-1 sends."""
    if n == 1:
        return [{"sent": 0, "received": 0}]
    size = [(b - a) * element_size for a, b in chunk_bounds(numel, n)]
    sent = [2 * sum(size) - size[r] - size[(r + 1) % n] for r in range(n)]
    return [{"sent": sent[r], "received": sent[(r - 1) % n]} for r in range(n)]


def run_bytes(method: str, config: DecentralizedConfig, n: int, numel: int, element_size: int = 4) -> list[dict]:
    """Per rank, {"sent", "received"} payload bytes of a whole run of `method` (METHODS)."""
    if method not in METHODS:
        raise ValueError(f"method={method!r} is not one of {METHODS}")
    s, T = numel * element_size, config.steps
    if method in ("allreduce_sgd", "local_sgd"):
        times = T if method == "allreduce_sgd" else len(averages_after(config))
        return [{k: times * v for k, v in r.items()} for r in ring_allreduce_bytes(numel, n, element_size)]
    if method == "decentralized_ps":
        return decentralized_ps_bytes(n, numel, T, element_size)
    topo = topology(config.topology, n)
    if method == "dpsgd":
        k = config.gossip_steps * T * s
        return [{"sent": k * len(topo.out_neighbours(i)), "received": k * len(topo.in_neighbours(i))}
                for i in range(n)]
    if method == "adpsgd":
        matched = [0] * n
        for t in range(T):
            for i in matching(topo, t, config.seed):
                matched[i] += 1
        return [{"sent": m * s, "received": m * s} for m in matched]
    c = communications(config) * s if n > 1 else 0
    return [{"sent": c * (n - 1), "received": c * (n - 1)}] + [{"sent": c, "received": c}] * (n - 1)


def per_step(rows: list[dict], steps: int) -> list[dict]:
    """Bytes per worker per step: each rank's totals / steps."""
    return [{k: v / steps for k, v in r.items()} for r in rows]
