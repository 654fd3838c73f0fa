"""A host's NIC shared by its ranks, measured on the emulated cluster: the k ranks of one
host each send n bytes to a partner on another host at the same moment. With a NIC per
rank (a DGX node's one per GPU) they all arrive after alpha + n/B; through one shared NIC
(`Profile(shared_nic=True)`, `ddnb.emulate.nic`) the messages take turns, and the last
arrives after k (alpha + n/B): the model with the sharing in it.

    rows = shared_nic_rows(ranks_per_host=4, nbytes=1 << 20)
    # [{"nic": "one per rank", "senders": 4, "measured": ..., "model": ...}, {"nic": "shared", ...}]

Taught in `notebooks/05_allreduce.ipynb`.
"""
from __future__ import annotations


def cross_host_sends(nbytes: int, ranks_per_host: int) -> float:
    """On every rank of a 2-host emulated world: rank r < k sends `nbytes` to rank r + k,
    all from one emulated start time; returns the emulated seconds from that start to the
    end of this rank's message (sent or received)."""
    import torch
    import torch.distributed as dist

    from ddnb.collectives import p2p
    from ddnb.emulate import current, messages, uncounted

    em, rank, k = current(), dist.get_rank(), ranks_per_host
    x = torch.zeros(nbytes // 4)
    start = torch.tensor([messages.barrier()], dtype=torch.float64)
    with uncounted():                         # bookkeeping: one start time for every rank
        dist.all_reduce(start, op=dist.ReduceOp.MAX)
    t0 = start.item() + 0.01                  # after the barrier's own messages
    em.advance_to(t0)
    if rank < k:
        p2p.send(x, rank + k)
    else:
        p2p.recv(x, rank - k)
    return em.now() - t0


def shared_nic_rows(ranks_per_host: int = 4, nbytes: int = 1 << 20, profile="10gbe", slowdown: float = 200.0,
                    timeout: float = 120) -> list[dict]:
    """Two rows, "one per rank" and "shared": the slowest of the k cross-host messages
    (measured, emulated seconds) beside the model, alpha + n/B per message, k of them in
    turn through a shared NIC. `profile`: its inter-host link is used; hosts get
    `ranks_per_host` ranks and a fast intra-host link. `slowdown`: high enough that ranks
    reach the shared NIC in emulated order (2k processes share this machine's cores)."""
    from ddnb._checks import Checks
    from ddnb.emulate import Link, get_profile, summary
    from ddnb.testing import World

    with Checks("shared_nic_rows") as check:
        check.integer("ranks_per_host", ranks_per_host, min=1)
        check.integer("nbytes", nbytes, min=4)
    base = get_profile(profile)
    base = base.with_(ranks_per_host=ranks_per_host, intra=Link(1e-6, 1e11), slowdown=slowdown)
    one = base.inter.time(nbytes)
    rows = []
    for shared in (False, True):
        with World(2 * ranks_per_host, emulate=base.with_(shared_nic=shared), timeout=timeout) as w:
            times = w.run(cross_host_sends, nbytes, ranks_per_host)
            line = summary(w.emulation_reports())
        rows.append({"nic": "shared" if shared else "one per rank", "senders": ranks_per_host,
                     "measured": max(times), "model": (ranks_per_host if shared else 1) * one,
                     "received": sorted(times[ranks_per_host:]), "summary": line})
    return rows
