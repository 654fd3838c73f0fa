"""ddnb.runtime.worker's thread rule: every ddnb process gets cores / local ranks intra-op
threads, at least 1, unless `threads=` or $DDNB_THREADS says otherwise."""
import os

import pytest
import torch

from ddnb.runtime.worker import available_cores, limit_threads, threads_for


def test_cores_are_this_process_s_affinity():
    want = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert available_cores() == want >= 1


@pytest.mark.parametrize("local_ranks", [1, 2, 3, 4, 64, 1000])
def test_cores_divided_among_the_local_ranks_at_least_one(local_ranks, monkeypatch):
    monkeypatch.delenv("DDNB_THREADS", raising=False)
    assert threads_for(local_ranks) == max(1, available_cores() // local_ranks)
    monkeypatch.setattr("ddnb.runtime.worker.available_cores", lambda: 8)
    assert threads_for(local_ranks) == max(1, 8 // local_ranks)


def test_the_argument_then_the_environment_override_the_rule(monkeypatch):
    monkeypatch.setattr("ddnb.runtime.worker.available_cores", lambda: 8)
    monkeypatch.setenv("DDNB_THREADS", "3")
    assert threads_for(4) == 3 and threads_for(4, threads=5) == 5
    monkeypatch.setenv("DDNB_THREADS", " ")   # blank: not set
    assert threads_for(4) == 2


@pytest.mark.parametrize("env, threads, local_ranks, message", [
    ("0", None, 1, r"\$DDNB_THREADS='0': intra-op threads must be an integer >= 1"),
    ("two", None, 1, r"\$DDNB_THREADS='two'"),
    (None, 0, 1, r"threads=0: intra-op threads must be an integer >= 1"),
    (None, 2.5, 1, r"threads=2.5"),
    (None, True, 1, r"threads=True"),
    (None, None, 0, r"local_ranks=0: need an integer >= 1"),
])
def test_bad_values_are_named(env, threads, local_ranks, message, monkeypatch):
    if env is None:
        monkeypatch.delenv("DDNB_THREADS", raising=False)
    else:
        monkeypatch.setenv("DDNB_THREADS", env)
    with pytest.raises(ValueError, match=message):
        threads_for(local_ranks, threads)


def test_limit_threads_sets_torch_and_the_openmp_variables(monkeypatch):
    before = torch.get_num_threads()
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)   # restored after the test
    try:
        assert limit_threads(1, threads=3) == 3 == torch.get_num_threads()
        assert os.environ["OMP_NUM_THREADS"] == os.environ["MKL_NUM_THREADS"] == "3"
    finally:
        torch.set_num_threads(before)
