"""The local ipyparallel controller and engines behind `ddnb.Cluster(n)`, started fast,
and the clock that says where a start-up went (`Cluster.startup_phases`).

Where the time of a 4-worker start went on 2 cores (measured): each engine had connected
and was ready about 1 s after it was spawned, yet the controller listed it only ~6 s
later. The controller's heart monitor registers an engine at the first beat after the
engine has answered a ping, and it beats every 3 s by default, so every engine waited
for two beats. Here it beats every HEARTBEAT_MS instead, and still drops an engine only
after the same 30 s of silence as ipyparallel's default (HEARTBEAT_MISSES beats).
What remains is CPU work: four Pythons importing ipyparallel and then torch, two cores.
Taught in `notebooks/00_getting_started.ipynb`.
"""
from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import time

import ipyparallel as ipp
import psutil

from ddnb.runtime import zygote
from ddnb.runtime.errors import WorkerTimeoutError

HEARTBEAT_MS = 500              # ipyparallel: 3000
HEARTBEAT_MISSES = 60           # x 0.5 s = 30 s before a silent engine is dropped, as 10 x 3 s is
# Run by each engine before it registers: import torch in a background thread, so that
# the import overlaps the registration instead of following it (binds no name).
IMPORT_TORCH = ("__import__('threading').Thread(target=__import__, args=('torch',), daemon=True, "
                "name='ddnb-import-torch').start()")


def start_controller(start_timeout: float):
    """Start a controller on this host with a fast heartbeat; (ipp.Cluster, Client,
    controller pid)."""
    cluster = ipp.Cluster(n=0, log_level=40, shutdown_atexit=True, engine_timeout=start_timeout,
                          controller_args=[f"--HeartMonitor.period={HEARTBEAT_MS}",
                                           f"--HeartMonitor.max_heartmonitor_misses={HEARTBEAT_MISSES}"])
    with quiet():
        cluster.start_controller_sync()
    pid = getattr(cluster.controller, "pid", None) or None
    with quiet():
        client = cluster.connect_client_sync()
    return cluster, client, pid


def start_engines(cluster, client, k: int, threads: int, start_timeout: float) -> tuple[list[int], list[int]]:
    """Start k engines with `threads` intra-op threads each and wait until the controller
    lists them; (their engine ids, pids of helper processes to reap at stop: the zygote).
    On Linux they are forked from one process that imported torch once
    (`ddnb.runtime.zygote`); elsewhere, or with DDNB_ENGINE_START=spawn, ipyparallel spawns
    each one."""
    # Local engines see the modules the notebook sees (a helpers.py beside it, a test file).
    path = [p for p in sys.path if p and os.path.isdir(p)]
    env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "OPENBLAS_NUM_THREADS": str(threads),
           "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join(dict.fromkeys([os.getcwd()] + path))}
    before = set(client.ids)
    proc = None
    if zygote.usable():
        log_dir = os.path.join(cluster.profile_dir, "log")
        os.makedirs(log_dir, exist_ok=True)
        with open(os.path.join(log_dir, f"ddnb-engines-{cluster.cluster_id}.log"), "ab") as log:
            proc = subprocess.Popen(zygote.command(k, os.getpid(), ["--profile-dir", cluster.profile_dir,
                                                                   "--cluster-id", cluster.cluster_id]),
                                    env={**os.environ, **env}, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    else:
        with quiet():
            cluster.start_engines_sync(k, environment=env,
                                       engine_args=[f"--IPEngine.startup_command={IMPORT_TORCH}"])
    deadline = time.monotonic() + start_timeout
    while len(set(client.ids) - before) < k:
        got = len(set(client.ids) - before)
        if proc is not None and proc.poll() is not None:
            raise WorkerTimeoutError([], f"the process forking the engines exited (code {proc.returncode}) "
                                         f"after {got} of {k} registered; see {log.name}")
        if time.monotonic() > deadline:
            raise WorkerTimeoutError([], f"only {got} of {k} engines registered within {start_timeout:.0f} s")
        time.sleep(0.02)
    return sorted(set(client.ids) - before), [proc.pid] if proc is not None else []


class Laps:
    """A stopwatch with named laps: lap("engines") adds the seconds since the last lap to
    phases["engines"]."""

    def __init__(self):
        self.phases: dict[str, float] = {}
        self._last = time.monotonic()

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.phases[name] = self.phases.get(name, 0.0) + now - self._last
        self._last = now


def no_lap(name: str) -> None:
    """What `Cluster._form_world` times with outside a start (a resize)."""


def reap(pids, wait: float, grace: float = 0.0) -> None:
    """Give the processes `grace` seconds to exit by themselves (e.g. after a shutdown
    request), then SIGTERM, then SIGKILL what is still there after `wait` seconds."""
    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            procs.append(psutil.Process(pid))
    if grace > 0:
        _, procs = psutil.wait_procs(procs, timeout=grace)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(procs, timeout=wait)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=wait)


@contextlib.contextmanager
def quiet():
    """ipyparallel prints progress and log lines while starting; keep cells clean."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        yield


def connect_ipcluster(profile, cluster_id, profile_dir, want: int, timeout: float):
    """Find an ipcluster started elsewhere (ssh, MPI, Slurm engines) by its cluster file,
    which may still be being written, connect a client, and wait until it has at least
    `want` engines; WorkerTimeoutError after `timeout` s. Returns (ipp.Cluster, Client)."""
    where = {"cluster_id": cluster_id or ""}
    where.update({"profile_dir": profile_dir} if profile_dir else {"profile": profile or "default"})
    described = ", ".join(f"{k}={v!r}" for k, v in where.items())
    deadline = time.monotonic() + timeout
    while True:
        try:
            ipc = ipp.Cluster.from_file(**where)
            break
        except (FileNotFoundError, ValueError):  # not there yet, or half written (empty JSON)
            if time.monotonic() > deadline:
                raise WorkerTimeoutError([], f"no ipcluster found ({described}) within {timeout:.0f} s; "
                                             "start one first, e.g. `ipcluster start -n 4 --cluster-id=ID "
                                             "--engines=ssh`") from None
            time.sleep(0.2)
    with quiet():
        client = ipc.connect_client_sync()
    while len(client.ids) < want:
        if time.monotonic() > deadline:
            raise WorkerTimeoutError([], f"the ipcluster ({described}) has {len(client.ids)} engines, "
                                         f"{want} wanted, after {timeout:.0f} s")
        time.sleep(0.1)
    return ipc, client
