"""ddnb.bench.emulated_ring: the ring all-reduce timed on an emulated cluster matches the
alpha-beta-gamma formula it never reads (each message alpha + n/B, each add its memory
time), and its latency and bandwidth terms, measured apart, match 2(N-1)alpha and
2(N-1)/N S/B; bad arguments are named before any process starts."""
import pytest

from ddnb.bench.emulated_ring import emulated_allreduce, ring_terms
from ddnb.cost import allreduce_time
from ddnb.emulate import custom, overruns

ALPHA, BW, MEM = 1e-4, 1e9, 1e12
PROFILE = custom(alpha=ALPHA, bandwidth=BW, memory_bandwidth=MEM, slowdown=20)


def test_the_emulated_ring_takes_the_formulas_time():
    got = emulated_allreduce(2, [1 << 20], PROFILE)
    assert got["workers"] == 2 and got["profile"] == "custom" and "emulated 'custom'" in got["emulation"]
    formula = allreduce_time("ring", 1 << 20, 2, ALPHA, 1 / BW, 3 / MEM)    # an add reads 2 and writes 1 byte
    if overruns(got["emulation"]) == 0:
        assert got["times"][1 << 20] == pytest.approx(formula, rel=0.03)
    assert got["times"][1 << 20] >= 0.99 * formula                         # an overrun only adds time


def test_the_two_terms_measured_apart():
    nbytes = 300_000
    rows = ring_terms([2, 3], nbytes, PROFILE)
    assert [r["workers"] for r in rows] == [2, 3]
    for r in rows:
        n = r["workers"]
        assert r["total"] == pytest.approx(r["latency"] + r["bandwidth"])
        if overruns(r["emulation"]) == 0:
            assert r["latency"] == pytest.approx(2 * (n - 1) * ALPHA, rel=0.03)
            assert r["bandwidth"] == pytest.approx(2 * (n - 1) / n * nbytes / BW, rel=0.05)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r"emulated_allreduce: workers=0.*sizes=\[6\].*algorithm='rings'.*profile=None"):
        emulated_allreduce(0, [6], None, algorithm="rings")
    with pytest.raises(ValueError, match=r"ring_terms: workers=\[1, 2\].*"):
        ring_terms([1, 2], 400, PROFILE)
    with pytest.raises(ValueError, match=r"nbytes=8: need a multiple of 4 above 4 x the most workers \(12\)"):
        ring_terms([2, 3], 8, PROFILE)
