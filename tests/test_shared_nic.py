"""A host's NIC shared by its ranks (`Profile(shared_nic=True)`, `ddnb.emulate.nic`): two
ranks of one host sending to the other host at once take turns on the NIC; with a NIC
per rank they do not. Measured against the alpha-beta model with the sharing in it."""
import os

import pytest
from ddnb.bench.nic import shared_nic_rows
from ddnb.emulate import custom
from ddnb.emulate.nic import SharedNics

ALPHA, BW, NBYTES = 1e-3, 1e8, 400_000          # one message: 1 ms + 4 ms on the inter-host link
FLAT = custom(alpha=ALPHA, bandwidth=BW, peak_flops=1e12, efficiency=1.0, memory_bandwidth=1e12, slowdown=10)


def test_a_shared_nic_makes_the_hosts_ranks_take_turns_as_the_model_says():
    per_rank, shared = shared_nic_rows(ranks_per_host=2, nbytes=NBYTES, profile=FLAT, slowdown=20)
    one = ALPHA + NBYTES / BW
    # a NIC per rank: both messages at once; one shared NIC: one message, then the other
    assert per_rank["received"] == pytest.approx([one, one], rel=1e-3)
    assert shared["received"] == pytest.approx([one, 2 * one], rel=1e-3)
    for row in (per_rank, shared):
        assert row["measured"] == pytest.approx(row["model"], rel=1e-3)
        assert "no overruns" in row["summary"] and "shared-NIC" not in row["summary"]
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
