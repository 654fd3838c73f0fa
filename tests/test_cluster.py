"""ddnb.Cluster: ipyparallel engines as the ranks of one torch.distributed world."""
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest

from ddnb.runtime.cluster import Cluster
from ddnb.runtime.placement import choose_backend as _choose_backend
from ddnb.runtime.worker import threads_for
from ddnb.runtime.errors import WorkerError, WorkerLostError, WorkerTimeoutError
from conftest import requires_horovod


def rank_info():
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return dist.get_rank(), dist.get_world_size(), dist.get_backend(), t.item(), torch.get_num_threads()


def engines(pids):
    """The pids among `pids` that are ipyparallel engines: spawned ones run ipyparallel.engine,
    forked ones are children of ddnb's zygote (ddnb/runtime/zygote.py)."""
    def is_engine(p):
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(p)
            parent = proc.parent()
            return ("ipyparallel.engine" in " ".join(proc.cmdline())
                    or (parent is not None and "ddnb.runtime.zygote" in " ".join(parent.cmdline())))
        return False
    return [p for p in pids if is_engine(p)]


def gone(pids, within=10.0):
    """True when none of pids is alive (zombies count as gone) within `within` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return True
        time.sleep(0.1)
    return False


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(n=3, timeout=30)
    yield c
    c.stop()


def test_ranks_backend_and_results_in_rank_order(cluster):
    got = cluster.run(rank_info)
    assert [g[:4] for g in got] == [(r, 3, "gloo", 3.0) for r in range(3)]
    assert [w["rank"] for w in cluster.workers] == [0, 1, 2]
    assert [w["local_rank"] for w in cluster.workers] == [0, 1, 2]
    assert all(w["device"] == "cpu" and w["backend"] == "gloo" for w in cluster.workers)
    assert len({w["pid"] for w in cluster.workers}) == 3  # one process per worker
    assert os.getpid() not in {w["pid"] for w in cluster.workers}
    # intra-op threads: the cores / the 3 workers on this host, at least 1
    assert [g[4] for g in got] == [w["threads"] for w in cluster.workers] == [threads_for(3)] * 3


def test_run_with_arguments_and_per_rank_arguments(cluster):
    assert cluster.run(lambda a, b=1: a * b, 3, b=2) == [6, 6, 6]
    assert cluster.run_ranks(lambda x: x + 1, [(0,), (10,), (20,)]) == [1, 11, 21]


def test_engine_namespace_has_rank_and_world_size(cluster):
    got = cluster.run(lambda: eval("(rank, world_size, str(device), backend)", __import__("__main__").__dict__))
    assert got == [(r, 3, "cpu", "gloo") for r in range(3)]


def test_a_raising_rank_is_named(cluster):
    def fail_on_two():
        import torch.distributed as dist

        if dist.get_rank() == 2:
            raise KeyError("missing on purpose")
        return "ok"

    with pytest.raises(WorkerError, match=r"rank 2 raised KeyError") as e:
        cluster.run(fail_on_two)
    assert e.value.rank == 2
    assert [g[0] for g in cluster.run(rank_info)] == [0, 1, 2]  # still usable


def test_a_raising_rank_names_the_ranks_it_may_have_left_blocked(cluster):
    def fail_while_others_wait():
        import time

        import torch.distributed as dist

        if dist.get_rank() == 0:
            raise RuntimeError("stage 0 failed")
        time.sleep(2)             # stands for ranks 1 and 2 waiting on a message from rank 0
        return "done"

    with pytest.raises(WorkerError, match=r"rank 1, rank 2 still running fail_while_others_wait: "
                                          r"possibly blocked waiting for rank 0") as e:
        cluster.run(fail_while_others_wait)
    assert e.value.rank == 0 and "stage 0 failed" in str(e.value)
    assert [g[0] for g in cluster.run(rank_info)] == [0, 1, 2]  # the sleepers finished: usable again


def test_a_killed_engine_is_named_within_the_timeout():
    c = Cluster(n=3, timeout=20)
    pids = c.pids()
    victim = c.workers[1]["pid"]
    try:
        def blocked_allreduce():
            import torch
            import torch.distributed as dist

            t = torch.ones(1)
            time.sleep(1.0)
            dist.all_reduce(t)
            return t.item()

        threading.Timer(0.3, os.kill, (victim, signal.SIGKILL)).start()
        t0 = time.monotonic()
        with pytest.raises(WorkerLostError, match=rf"rank 1 \(engine \d+, pid {victim}") as e:
            c.run(blocked_allreduce)
        assert e.value.ranks == [1]
        assert time.monotonic() - t0 < 20
        c.restart()  # a fresh world in the same process
        assert [g[:2] for g in c.run(rank_info)] == [(0, 3), (1, 3), (2, 3)]
        pids += c.pids()
    finally:
        c.stop()
    assert gone(pids)


def test_asynchronous_ps_outlives_a_worker_whose_process_dies():
    """PSConfig(fail_how="exit"): worker rank 3's process exits mid-step. Under ASP the
    server declares it lost after worker_timeout and finishes with the others;
    run_surviving returns their results and a LostWorker for rank 3; run then refuses
    until restart; nothing is left running."""
    from functools import partial

    from ddnb import LostWorker
    from ddnb.data import digits
    from ddnb.models import mlp
    from ddnb.parameter_server import PSConfig, train

    train_set, _ = digits()
    model_fn = partial(mlp, (64, 16, 10))
    c = Cluster(n=4, timeout=30)
    pids = c.pids()
    victim = c.workers[3]["pid"]
    try:
        config = PSConfig(mode="asp", steps=20, batch_size=16, lr=0.1, worker_timeout=2.0,
                          fail_rank=3, fail_after_steps=4, fail_how="exit")
        server, w1, w2, lost = c.run_surviving(train, config, model_fn, train_set)
        assert lost == LostWorker(3, lost.where) and f"pid {victim}" in lost.where
        assert not psutil.pid_exists(victim) or psutil.Process(victim).status() == psutil.STATUS_ZOMBIE
        assert [x["rank"] for x in server["lost"]] == [3] and server["lost"][0]["clock"] == 4
        assert server["updates"] == server["gradients"] == 20 + 20 + 4   # no update lost
        assert len(w1["losses"]) == len(w2["losses"]) == 20
        assert not c.alive()
        with pytest.raises(WorkerLostError, match=r"rank\(s\) 3 of this cluster died earlier.*restart"):
            c.run(rank_info)
        c.restart()
        assert [g[:2] for g in c.run(rank_info)] == [(0, 4), (1, 4), (2, 4), (3, 4)]
        pids += c.pids()
    finally:
        c.stop()
    assert gone(pids)


def test_a_hung_engine_times_out_naming_its_rank():
    c = Cluster(n=2, timeout=3)
    pids = c.pids()
    try:
        def hang_on_zero():
            import torch.distributed as dist

            if dist.get_rank() == 0:
                time.sleep(30)

        t0 = time.monotonic()
        with pytest.raises(WorkerTimeoutError, match=r"rank 0 did not finish hang_on_zero within 3 s") as e:
            c.run(hang_on_zero)
        assert e.value.ranks == [0]
        assert time.monotonic() - t0 < 6
    finally:
        c.stop()
    assert gone(pids)


def test_resize_reforms_the_world_and_stop_leaves_nothing():
    c = Cluster(n=2, timeout=30)
    started = set(c.pids())
    try:
        assert [g[:2] for g in c.run(rank_info)] == [(0, 2), (1, 2)]
        c.resize(4)
        started |= set(c.pids())
        assert [g[:4] for g in c.run(rank_info)] == [(r, 4, "gloo", 6.0) for r in range(4)]
        assert [g[4] for g in c.run(rank_info)] == [threads_for(4)] * 4   # re-sized to the new count
        c.resize(1)
        assert c.run(rank_info)[0][:2] == (0, 1)
        assert c.run(rank_info)[0][4] == threads_for(1)   # the lone worker: every core it has
        assert len(engines(c.pids())) == 1  # one engine left: the others were shut down
    finally:
        c.stop()
    assert gone(started)
    assert c.pids() == []
    c.stop()  # idempotent


def test_a_shrink_does_not_wait_on_an_engine_that_never_answers():
    """Shutting engines down waits on no reply (a forked engine once lost its shutdown_reply
    and the kernel waited forever): an engine that cannot answer (stopped) is killed, and
    the shrink goes on."""
    c = Cluster(n=2, timeout=30)
    try:
        victim = c.workers[1]
        os.kill(victim["pid"], signal.SIGSTOP)
        t0 = time.monotonic()
        c._shutdown_engines([victim["engine_id"]])
        assert time.monotonic() - t0 < 60      # 5 s grace, 5 s after SIGTERM, the controller's 30 s of heartbeats
        assert gone([victim["pid"]])
    finally:
        c.stop()


def test_context_manager_start_time_and_threads_override():
    t0 = time.monotonic()
    with Cluster(n=4, timeout=30, threads=3) as c:
        ready = time.monotonic() - t0
        pids = c.pids()
        assert len(engines(pids)) == 4 and len(pids) > 5  # + the controller and its schedulers
        assert [g[0] for g in c.run(rank_info)] == [0, 1, 2, 3]
        assert [g[4] for g in c.run(rank_info)] == [3, 3, 3, 3]   # threads= wins over cores / workers
        # forked engines (ddnb/runtime/zygote.py) reseed: each draws its own numbers
        assert len(set(c.run(lambda: __import__("torch").randn(1).item()))) == 4
        # where the start-up went, phase by phase, adds up to the whole
        assert list(c.startup_phases) == ["controller", "engines", "describe", "process_group", "names"]
        assert sum(c.startup_phases.values()) == pytest.approx(c.startup_seconds, abs=0.05)
    assert gone(pids)
    # the target is <= 15 s on 2 cores; this only guards against a gross regression
    assert ready < 60


@pytest.mark.parametrize("reaped", [True, False], ids=["reaped", "zombie"])
def test_engines_exit_when_the_kernel_is_killed(tmp_path, reaped):
    """A kernel killed with SIGKILL runs no atexit: the engines notice and take the
    controller with them, also while the killed kernel is a zombie that its parent has not
    reaped yet (pytest -x stopping nbval after a failed cell: a controller was left behind)."""
    script = tmp_path / "kernel.py"
    script.write_text(textwrap.dedent("""
        import sys, time
        from ddnb.runtime.cluster import Cluster
        c = Cluster(n=2, timeout=30)
        print(" ".join(map(str, c.pids())), flush=True)
        time.sleep(120)
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(engines(pids)) == 2 and len(pids) > 3
        proc.kill()
        if reaped:
            proc.wait()
        assert gone(pids, within=15)
    finally:
        proc.kill()
        proc.wait()


@requires_horovod
def test_horovod_on_the_same_engines():
    def both():
        import horovod.torch as hvd
        import torch
        import torch.distributed as dist

        x = torch.arange(3.0) + dist.get_rank()
        return hvd.rank(), hvd.size(), hvd.local_rank(), hvd.allreduce(x, op=hvd.Sum).tolist()

    with Cluster(n=2, horovod=True, timeout=30) as c:
        assert c.run(both) == [(0, 2, 0, [1.0, 3.0, 5.0]), (1, 2, 1, [1.0, 3.0, 5.0])]
        c.resize(3)
        assert [g[:2] for g in c.run(both)] == [(0, 3), (1, 3), (2, 3)]


@pytest.mark.parametrize("kwargs, message", [
    (dict(n=0), r"^Cluster: n=0: need an integer >= 1 and <= 64 workers"),
    (dict(n=-2), r"n=-2: need an integer >= 1 and <= 64"),
    (dict(n=1000), r"n=1000: need an integer >= 1 and <= 64 workers \(for more, connect to an ipcluster"),
    (dict(n=2.5), r"n=2.5: need an integer"),
    (dict(n="4"), r"n='4': need an integer"),
    (dict(backend="mpi"), r"backend='mpi' is not one of \('auto', 'gloo', 'nccl'\)"),
    (dict(timeout=0), r"timeout=0: need a number > 0 \(seconds\)"),
    (dict(threads=0), r"threads=0: need an integer >= 1"),
    (dict(n=0, backend="mpi", timeout=-1, threads=1.5),   # every problem, in one error
     r"^Cluster: n=0: .*; backend='mpi' is not one of .*; timeout=-1: .*; threads=1.5: need an integer >= 1$"),
])
def test_bad_arguments_fail_before_anything_starts(kwargs, message):
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(ValueError, match=message):
        Cluster(**kwargs)
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before


def test_backend_selection():
    mixed = "cpu:gloo,cuda:nccl"   # gloo for CPU tensors, nccl for CUDA tensors
    assert _choose_backend("auto", ["a", "a"], [0, 0]) == ("gloo", None)
    assert _choose_backend("auto", ["a", "a"], [2, 2]) == (mixed, None)
    assert _choose_backend("auto", ["a", "a", "b", "b"], [2, 2, 2, 2]) == (mixed, None)
    assert _choose_backend("nccl", ["a", "a"], [2, 2]) == ("nccl", None)   # pure nccl, as asked
    backend, note = _choose_backend("auto", ["a", "a", "a"], [1, 1, 1])
    assert backend == "gloo" and "a: 3 workers but 1 GPU" in note
    assert _choose_backend("gloo", ["a"], [8]) == ("gloo", None)
    with pytest.raises(ValueError, match=r"backend='nccl' needs one GPU per worker \(b: 2 workers but 1 GPU\)"):
        _choose_backend("nccl", ["a", "b", "b"], [1, 1, 1])
    with pytest.raises(ValueError, match="needs one GPU per worker"):
        _choose_backend("nccl", ["a"], [0])


def test_an_emulated_cluster_runs_on_gloo_and_says_so_on_a_gpu_host():
    for asked in ("auto", "nccl"):
        backend, note = _choose_backend(asked, ["a", "a"], [2, 2], emulated=True)
        assert backend == "gloo" and "emulated cluster runs on gloo" in note
    assert _choose_backend("auto", ["a", "a"], [0, 0], emulated=True) == ("gloo", None)   # nothing to say on a CPU host


def test_device_follows_the_backend():
    import torch

    from ddnb.collectives.devices import device_for, rank_device

    assert device_for("gloo", 1) == torch.device("cpu")
    assert device_for("nccl", 1) == device_for("cpu:gloo,cuda:nccl", 1) == torch.device("cuda", 1)
    assert rank_device() == torch.device("cpu")   # no process group in this process


def test_resize_rejects_bad_sizes(cluster):
    with pytest.raises(ValueError, match="n=0: need an integer >= 1 and <= 64"):
        cluster.resize(0)


@requires_horovod
def test_horovod_started_and_stopped_on_a_running_cluster(cluster):
    def hvd_sum():
        import horovod.torch as hvd
        import torch

        return hvd.allreduce(torch.ones(2), op=hvd.Sum).tolist()

    with pytest.raises(ValueError, match=r"env keys must be HOROVOD_\* settings, got \['CYCLE_TIME'\]"):
        cluster.start_horovod(env={"CYCLE_TIME": 5})
    assert not cluster.horovod
    cluster.start_horovod(env={"HOROVOD_FUSION_THRESHOLD": 0, "HOROVOD_CYCLE_TIME": 2.5})
    try:
        assert cluster.run(hvd_sum) == [[3.0, 3.0]] * 3
        knobs = cluster.run(lambda: [os.environ[k] for k in ("HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME")])
        assert knobs == [["0", "2.5"]] * 3
    finally:
        cluster.stop_horovod()
    assert cluster.run(lambda: __import__("horovod.torch").torch.is_initialized()) == [False] * 3
    assert [g[0] for g in cluster.run(rank_info)] == [0, 1, 2]  # torch.distributed untouched
    # other settings in the same processes: refused before any engine is asked (Horovod
    # 0.28.1 segfaults re-initializing with changed settings); the engines stay usable
    with pytest.raises(ValueError, match=r"already ran in these engines with other settings .*cluster.restart\(\)"):
        cluster.start_horovod(env={"HOROVOD_CYCLE_TIME": 5})
    assert not cluster.horovod and [g[0] for g in cluster.run(rank_info)] == [0, 1, 2]


def test_connect_to_an_ipcluster_started_elsewhere(tmp_path):
    """The several-machines path: ipcluster (here: local engines, in another process) is
    started on its own, and Cluster connects to it by cluster id and profile directory.
    stop() leaves that ipcluster's engines running: they are not ours."""
    from ddnb import timing
    from ddnb.runtime import worker

    ipcluster = os.path.join(os.path.dirname(sys.executable), "ipcluster")
    args = ["--cluster-id=ddnb-test", f"--profile-dir={tmp_path}"]
    proc = subprocess.Popen([ipcluster, "start", "-n", "3", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        c = Cluster(n=2, cluster_id="ddnb-test", profile_dir=str(tmp_path), timeout=30)
        assert [w["rank"] for w in c.workers] == [0, 1] and c.backend == "gloo"
        pids = c.run(os.getpid)
        assert len(set(pids)) == 2 and os.getpid() not in pids
        assert c.run(timing.time_allreduce, 1000, iters=2)[0] > 0  # a real all-reduce on the world
        assert [i["pid"] for i in c.run(worker.describe)] == pids
        c.stop()
        assert all(psutil.pid_exists(p) for p in pids)  # the external engines keep running
    finally:
        _stop_ipcluster(proc, [ipcluster, "stop", *args])


def _stop_ipcluster(proc, stop_command):
    """`ipcluster stop`, then make sure: whatever it started (controller, engines) is killed
    if `ipcluster start` has not exited within a minute, so a failed test leaves nothing behind."""
    tree = [proc.pid] + [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
    subprocess.run(stop_command, capture_output=True, timeout=60)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(psutil.Error):
            tree += [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
    for pid in set(tree):
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()
    proc.wait(timeout=10)
    assert proc.returncode is not None


def test_connect_without_an_ipcluster_says_so(tmp_path):
    with pytest.raises(WorkerTimeoutError, match=r"no ipcluster found \(cluster_id='nope', profile_dir=.*ipcluster start"):
        Cluster(n=2, cluster_id="nope", profile_dir=str(tmp_path), start_timeout=1)
