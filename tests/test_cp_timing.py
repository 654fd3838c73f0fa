"""Timing the context-parallel schemes: every rank returns the same (slowest rank's) time,
in real mode and in an emulated cluster, and bad schemes are named."""
import pytest

from ddnb.bench.context_parallel import emulated_comparison
from ddnb.context_parallel.timing import time_attention


def test_every_rank_reports_the_slowest_time(world):
    for scheme in ("allgather", "ring"):
        got = world(2).run(time_attention, scheme, seq_len=16, heads=2, head_dim=4, repeats=1)
        assert got[0] == got[1] > 0


def test_emulated_rows_and_summary():
    from ddnb.emulate import get_profile

    rows, summary = emulated_comparison(get_profile("ib").with_(slowdown=200), workers=2, seq_lens=(32,), heads=2,
                                        head_dim=8)
    assert [(r["pass"], r["scheme"]) for r in rows] == [("forward", "allgather"), ("forward", "ring"),
                                                        ("forward+backward", "allgather"), ("forward+backward", "ring")]
    assert all(r["time"] > 0 for r in rows) and summary.startswith("emulated 'ib'")


def test_bad_scheme(world):
    from ddnb.runtime.errors import WorkerError

    with pytest.raises(WorkerError, match=r"scheme='tree'"):
        world(2).run(time_attention, "tree")
