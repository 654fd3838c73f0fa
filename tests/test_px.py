"""A worker lost inside a %%px cell is named by its rank (ddnb.runtime.px), not only by the engine
id ipyparallel reports: after a resize the two differ."""
import os
import subprocess
import sys
import textwrap

from ipyparallel.error import CompositeError

from ddnb.runtime.px import dead_engines, lost_worker_message

WORKERS = [{"rank": 0, "engine_id": 0, "pid": 100, "host": "a"},
           {"rank": 1, "engine_id": 1, "pid": 101, "host": "a"},
           {"rank": 2, "engine_id": 3, "pid": 103, "host": "b"}]


def composite(*errors):
    """A CompositeError as ipyparallel builds it from (ename, evalue, traceback, engine_info)."""
    return CompositeError("one or more exceptions raised in: %px", list(errors))


def test_the_dead_engine_is_named_by_its_rank():
    err = composite(("RuntimeError", "Connection closed by peer", "", {"engine_id": 0, "method": "execute"}),
                    ("EngineError", "Engine 3 died while running task 'abc'", "", {}),
                    ("RuntimeError", "Connection closed by peer", "", {"engine_id": 1, "method": "execute"}))
    assert dead_engines(err) == [3]
    assert lost_worker_message(WORKERS, err) == (
        "ddnb: rank 2 (engine 3, pid 103 on b) died during this %%px cell; the other ranks' errors "
        "follow from it: call cluster.restart()")


def test_no_message_when_no_engine_died():
    err = composite(("ValueError", "bad", "", {"engine_id": 0, "method": "execute"}))
    assert dead_engines(err) == [] and lost_worker_message(WORKERS, err) is None
    assert lost_worker_message(WORKERS, ValueError("not a CompositeError")) is None


def test_an_engine_that_is_not_a_rank_says_so():
    err = composite(("EngineError", "Engine 7 died while running task 'x'", "", {}),
                    ("EngineError", "Engine 0 died while running task 'y'", "", {}))
    assert lost_worker_message(WORKERS, err) == (
        "ddnb: engine 7 (not a rank of this cluster), rank 0 (engine 0, pid 100 on a) died during this "
        "%%px cell; the other ranks' errors follow from it: call cluster.restart()")


SCRIPT = textwrap.dedent('''
    import sys
    from IPython.testing.globalipapp import start_ipython
    import ddnb
    shell = start_ipython()
    cluster = ddnb.Cluster(n=3, timeout=30)
    try:
        cluster.resize(2)
        cluster.resize(3)                      # rank 2 is now a new engine, id 3
        print("WORKERS", [(w["rank"], w["engine_id"]) for w in cluster.workers], flush=True)
        result = shell.run_cell("""%%px
    import os, signal
    if rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    x = torch.ones(4)
    dist.all_reduce(x)
    """)
        print("ERROR", type(result.error_in_exec).__name__, flush=True)
        cluster.restart()
        print("AFTER", shell.run_cell("%px print(rank)").success, cluster.run(lambda: 1), flush=True)
    finally:
        cluster.stop()
''')


def test_a_worker_killed_in_a_px_cell_is_named_by_rank():
    """A real IPython shell and cluster (in a subprocess, so that no global IPython is left
    in pytest's): 3 workers, resized to 2 and back to 3, so rank 2 runs on engine 3; rank
    2's process is killed inside a %%px all-reduce. The usual error shows, then ddnb's line
    naming rank 2, engine 3 and its pid; restart() gives a working %px again."""
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=240,
                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "WORKERS [(0, 0), (1, 1), (2, 3)]" in text, text
    assert "ERROR CompositeError" in text and "Engine 3 died while running task" in text, text
    assert "ddnb: rank 2 (engine 3, pid " in text and "died during this %%px cell" in text, text
    assert "AFTER True [1, 1, 1]" in text, text
