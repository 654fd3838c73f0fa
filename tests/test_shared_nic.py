"""A host's NIC shared by its ranks (`Profile(shared_nic=True)`, `ddnb.emulate.nic`): two
ranks of one host sending to the other host at once take turns on the NIC; with a NIC
per rank they do not. Measured against the alpha-beta model with the sharing in it."""
import os

import pytest
import torch

from ddnb.emulate import Link, custom
from ddnb.emulate.nic import SharedNics
from ddnb.testing import World

ALPHA, BW, NBYTES = 1e-3, 1e8, 400_000          # one message: 1 ms + 4 ms on the inter-host link
FLAT = custom(alpha=ALPHA, bandwidth=BW, peak_flops=1e12, efficiency=1.0, memory_bandwidth=1e12, slowdown=10)
TWO_HOSTS = FLAT.with_(intra=Link(1e-6, 1e11), ranks_per_host=2)     # ranks 0, 1 | 2, 3


def _cross(nbytes):
    """Ranks 0 and 1 (host 0) each send `nbytes` to rank r + 2 (host 1) at the same moment;
    returns (emulated seconds from the barrier to the end of this rank's message, conflicts)."""
    import torch.distributed as dist

    from ddnb.collectives import p2p
    from ddnb.emulate import current, messages

    from ddnb.emulate import uncounted

    em, rank = current(), dist.get_rank()
    x = torch.zeros(nbytes // 4)
    start = torch.tensor([messages.barrier()], dtype=torch.float64)
    with uncounted():                         # bookkeeping: one start time for every rank
        dist.all_reduce(start, op=dist.ReduceOp.MAX)
    t0 = start.item() + 0.01                  # after the barrier's own messages
    em.advance_to(t0)
    if rank < 2:
        p2p.send(x, rank + 2)
    else:
        p2p.recv(x, rank - 2)
    return em.now() - t0, em.nic_conflicts


def test_a_nic_of_its_own_per_rank_sends_both_at_once():
    with World(4, emulate=TWO_HOSTS, timeout=60) as w:
        times = [t for t, _ in w.run(_cross, NBYTES)]
    one = ALPHA + NBYTES / BW
    assert times == pytest.approx([one] * 4, rel=1e-3)


def test_a_shared_nic_makes_the_hosts_ranks_take_turns():
    with World(4, emulate=TWO_HOSTS.with_(shared_nic=True), timeout=60) as w:
        out = w.run(_cross, NBYTES)
        summary = w.emulation_summary() if hasattr(w, "emulation_summary") else ""
    one = ALPHA + NBYTES / BW
    senders, receivers = sorted(t for t, _ in out[:2]), sorted(t for t, _ in out[2:])
    # the model with the sharing: the NIC carries one message, then the other (each alpha + n/B)
    assert senders == pytest.approx([one, 2 * one], rel=1e-3)
    assert receivers == pytest.approx([one, 2 * one], rel=1e-3)
    assert sum(c for _, c in out) == 0 and "shared-NIC" not in summary
    assert not [f for f in os.listdir("/dev/shm") if f.startswith(f"ddnb-nic-{os.getuid()}-")]   # cleaned up


def test_a_reservation_takes_the_first_gap_and_counts_a_reordering():
    nics = SharedNics("test-gap", hosts=1)
    try:
        assert nics.reserve(0, "out", 10.0, 1.0) == (10.0, False)        # [10, 11]
        assert nics.reserve(0, "out", 5.0, 2.0) == (5.0, False)          # fits before it: [5, 7]
        assert nics.reserve(0, "out", 6.0, 1.0) == (7.0, False)          # after [5, 7]: [7, 8]
        assert nics.reserve(0, "out", 8.5, 2.0) == (11.0, True)          # [10, 11], reserved first, pushed it
        assert nics.reserve(0, "in", 8.5, 2.0) == (8.5, False)           # the other direction is free
    finally:
        nics.close(unlink=True)
    with pytest.raises(ValueError, match="shared_nic"):
        FLAT.with_(shared_nic="yes")
