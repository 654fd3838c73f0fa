"""ddnb.testing itself: results in rank order, errors that name the rank, no hang."""
import os
import time

import pytest
import torch
import torch.distributed as dist

from ddnb.runtime.errors import WorkerError, WorkerLostError, WorkerTimeoutError
from ddnb.testing import World, check_backend, run_world
from ddnb.runtime.worker import threads_for
from conftest import requires_horovod


def rank_and_sum():
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    return dist.get_rank(), dist.get_world_size(), t.item(), torch.get_num_threads()


@pytest.mark.parametrize("n", [1, 2, 3])
def test_results_in_rank_order(world, n):
    got = world(n).run(rank_and_sum)
    total = n * (n + 1) / 2
    # each rank: the cores / n intra-op threads, at least 1 (ddnb.runtime.worker.threads_for)
    assert got == [(r, n, total, threads_for(n)) for r in range(n)]


def test_threads_override(monkeypatch):
    """threads= wins over $DDNB_THREADS, which wins over cores / ranks."""
    monkeypatch.setenv("DDNB_THREADS", "2")
    with World(2, threads=3) as w:
        assert w.threads == 3 and [g[3] for g in w.run(rank_and_sum)] == [3, 3]
    with World(1) as w:
        assert w.threads == 2 and w.run(rank_and_sum)[0][3] == 2


def test_run_ranks_gives_each_rank_its_arguments(world):
    got = world(2).run_ranks(lambda x: x * 10 + dist.get_rank(), [(1,), (2,)])
    assert got == [10, 21]


def test_a_raising_rank_is_named(world):
    def fail_on_one():
        if dist.get_rank() == 1:
            raise ValueError("bad value on purpose")
        return "fine"

    w = world(3)
    with pytest.raises(WorkerError, match=r"(?s)rank 1 raised.*ValueError: bad value on purpose") as e:
        w.run(fail_on_one)
    assert e.value.rank == 1
    assert not w.broken  # the others finished: the world is still usable
    assert w.run(lambda: dist.get_rank()) == [0, 1, 2]


def test_a_dying_rank_is_named_and_nobody_hangs():
    def die_on_two():
        if dist.get_rank() == 2:
            os._exit(3)
        t = torch.ones(1)
        dist.all_reduce(t)  # ranks 0 and 1 block here: rank 2 never comes
        return t.item()

    w = World(3, timeout=30)
    pids = w.pids()
    t0 = time.monotonic()
    with pytest.raises(WorkerLostError, match=r"rank 2 .* died with exit code 3") as e:
        w.run(die_on_two)
    assert e.value.ranks == [2]
    assert time.monotonic() - t0 < 10
    time.sleep(0.2)
    assert not any(_alive(p) for p in pids)


def test_a_hung_rank_times_out_and_is_killed():
    w = World(2, timeout=30)
    pids = w.pids()
    t0 = time.monotonic()
    with pytest.raises(WorkerTimeoutError, match=r"ranks \[1\] did not finish") as e:
        w.run(lambda: time.sleep(60) if dist.get_rank() == 1 else None, timeout=2)
    assert e.value.ranks == [1]
    assert time.monotonic() - t0 < 10
    assert w.broken and not any(_alive(p) for p in pids)


def test_run_world_one_shot():
    assert run_world(2, lambda a, b=0: a + b + dist.get_rank(), 5, b=1) == [6, 7]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_bad_world_size(bad):
    with pytest.raises(ValueError, match=rf"^World: n={bad!r}: need an integer >= 1 \(ranks\)$"):
        World(bad)
    with pytest.raises(ValueError, match=r"^World: n=0: .*; timeout=-1: need a number > 0 \(seconds\); threads=0: need "
                                         r"an integer >= 1$"):
        World(0, timeout=-1, threads=0)


def test_backend_is_checked_before_any_process_starts():
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(ValueError, match=r"backend must be one of \('gloo', 'nccl', 'cpu:gloo,cuda:nccl', 'auto'\), "
                                         r"got 'mpi'"):
        World(2, backend="mpi")
    with pytest.raises(ValueError, match=rf"nccl' needs one CUDA device per rank: {gpus + 1} ranks, {gpus} device"):
        World(gpus + 1, backend="nccl")


@pytest.mark.parametrize("backend, n, gpus, formed", [
    ("gloo", 4, 8, "gloo"), ("auto", 2, 0, "gloo"), ("auto", 2, 1, "gloo"), ("auto", 2, 2, "cpu:gloo,cuda:nccl"),
    ("nccl", 2, 2, "nccl"), ("cpu:gloo,cuda:nccl", 2, 4, "cpu:gloo,cuda:nccl")])
def test_backend_a_world_forms(backend, n, gpus, formed):
    assert check_backend(backend, n, gpus=gpus) == formed
    if backend != "gloo" and gpus:
        with pytest.raises(ValueError, match=rf"{n + gpus} ranks, {gpus} device"):
            check_backend(backend if backend != "auto" else "nccl", n + gpus, gpus=gpus)


def backend_and_device():
    return dist.get_backend(), torch.cuda.current_device() if torch.cuda.is_available() else None


def test_gloo_is_the_default_backend(world):
    assert world(2).run(backend_and_device) == [("gloo", None if not torch.cuda.is_available() else r % torch.cuda.device_count())
                                                for r in range(2)]


@requires_horovod
def test_horovod_world_agrees_with_torch(world):
    def both():
        import horovod.torch as hvd

        x = torch.arange(4.0) * (dist.get_rank() + 1)
        y = x.clone()
        dist.all_reduce(y)
        return hvd.rank(), hvd.size(), hvd.allreduce(x, op=hvd.Sum).tolist(), y.tolist()

    got = world(2, horovod=True).run(both)
    assert [g[:2] for g in got] == [(0, 2), (1, 2)]
    assert all(g[2] == g[3] == [0.0, 3.0, 6.0, 9.0] for g in got)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


def test_ranks_see_the_environment_of_their_worlds_start(monkeypatch):
    """Ranks are forked from a fork server started once (ddnb.runtime.zygote.mp_context):
    each still sees the parent's environment as it is when its World starts, and a
    variable that acts at torch's import (the CPU kernels) gets ranks of its own."""
    def env_and_kernels():
        import os

        import torch

        return os.environ.get("DDNB_TEST_VAR"), torch.backends.cpu.get_cpu_capability()

    with World(2) as w:
        before = w.run(env_and_kernels)
    monkeypatch.setenv("DDNB_TEST_VAR", "set after the first World")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    with World(2) as w:
        after = w.run(env_and_kernels)
    assert [b[0] for b in before] == [None, None]
    assert after == [("set after the first World", "DEFAULT")] * 2


def test_forked_ranks_draw_their_own_random_numbers(monkeypatch):
    """A forked process starts with its parent's random state; Python's random module
    reseeds itself after a fork, so forked ranks (DDNB_ENGINE_START=fork) still draw
    different numbers, as spawned ones do."""
    import random

    monkeypatch.setenv("DDNB_ENGINE_START", "fork")
    with World(3) as w:
        got = w.run(lambda: random.random())
    assert len(set(got)) == 3
