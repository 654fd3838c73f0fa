"""A cluster of workers from a notebook cell: ipyparallel engines (one process per worker)
joined into one torch.distributed world, and optionally into Horovod.

    with Cluster(n=4) as cluster:           # 4 local engines, gloo on CPU
        cluster.run(lambda: dist.get_rank())  # -> [0, 1, 2, 3]

Ranks are assigned here, explicitly, in order of (host, engine id): engine ids are
ipyparallel's bookkeeping and are not ranks. Every wait has a deadline (`timeout`), and a
worker that dies or hangs raises an error that names its rank. `stop()` (also run at
interpreter exit, and by the engines themselves if the kernel is killed) leaves no
process behind. Taught in `notebooks/00_getting_started.ipynb`.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import time
import warnings
import weakref

import ipyparallel as ipp
import psutil

from ddnb._checks import Checks
from ddnb.runtime import horovod as horovod_rt, local_engines, px, worker
from ddnb.runtime.errors import ClusterError, WorkerLostError
from ddnb.runtime.local_engines import quiet as _quiet, reap as _reap
from ddnb.runtime.placement import BACKENDS, assign_ranks, check_n, choose_backend, emulated_profile
from ddnb.runtime.waiting import await_ranks, pid_alive
_live_clusters: "weakref.WeakSet[Cluster]" = weakref.WeakSet()


@atexit.register
def _stop_all():
    for cluster in list(_live_clusters):
        cluster.stop()


class Cluster:
    """N workers, each an ipyparallel engine that is one rank of a torch.distributed world.

    Parameters
    ----------
    n : number of workers. With `profile`/`cluster_id`, the number of engines to use from
        an already running ipcluster (None: all of them).
    backend : "auto" (when every worker has a GPU of its own: "cpu:gloo,cuda:nccl", gloo
        for CPU tensors and nccl for CUDA tensors, each worker on cuda:local_rank; else
        gloo on CPU), "gloo", or "nccl" (pure nccl, as asked: collectives on CPU tensors
        then fail; ValueError without a GPU per worker). `Cluster.backend` and each
        worker's "backend" say which one was formed. Every engine gets `device`, the
        device its tensors belong on (cuda:local_rank with nccl, else cpu), so a %%px
        cell writes `torch.ones(3, device=device)` on any machine.
    horovod : also initialize Horovod (over Gloo, without horovodrun) on the same workers.
    timeout : seconds that any wait may take: engine start, process-group set-up, `run`,
        and every collective on the workers.
    profile, cluster_id, profile_dir : connect to an ipcluster started elsewhere (ssh, MPI, Slurm
        engines) instead of starting local engines; `stop()` then leaves its engines running.
    master_addr : address of rank 0 for the TCP rendezvous (default: 127.0.0.1 when every
        worker is on this host, else rank 0's host name).
    threads : intra-op threads per worker (default: $DDNB_THREADS, else the cores of its
        host / the workers on that host, at least 1: `ddnb.runtime.worker.threads_for`).
    start_timeout : seconds that starting engines and forming the world may take
        (default: the larger of `timeout` and 60; an engine imports torch as it starts).
    emulate : None (real mode: this machine's processes and wall-clock times), or a profile
        (a name in `ddnb.emulate.PROFILES`: "10gbe", "ib", "nvlink", or a `Profile`): the
        workers become an emulated cluster of that hardware (`ddnb.emulate`). Every worker
        must be on this host; Horovod is not emulated. A name's slowdown is calibrated to
        this machine and grows with the workers per core (`placement.default_slowdown`);
        a Profile's is used as given.
    """

    def __init__(self, n: int | None = 4, backend: str = "auto", horovod: bool = False,
                 timeout: float = 60, *, profile: str | None = None, cluster_id: str | None = None,
                 profile_dir: str | None = None,
                 master_addr: str | None = None, threads: int | None = None,
                 start_timeout: float | None = None, start: bool = True, emulate=None):
        self._connect = profile is not None or cluster_id is not None or profile_dir is not None
        with Checks("Cluster") as check:
            check_n(n, allow_none=self._connect, check=check)
            check.choice("backend", backend, BACKENDS)
            check.number("timeout", timeout, positive=True, why=" (seconds)")
            check.integer("threads", threads, min=1, none=True)
            check.rule(not horovod or horovod_rt.horovod_available(), "horovod=True but Horovod with PyTorch "
                       "is not installed (run `make lab` or scripts/install_horovod.sh)")
            self.emulate = emulated_profile(emulate, check, n)
            check.rule(not (horovod and emulate is not None), "emulate with horovod=True: Horovod is not "
                       "emulated (its collectives would run at real speed)")
        self.n, self.backend_requested, self.horovod = n, backend, horovod
        self.timeout, self.profile, self.cluster_id = float(timeout), profile, cluster_id
        self.profile_dir = profile_dir
        self.master_addr, self.threads = master_addr, threads
        self.start_timeout = float(start_timeout or max(self.timeout, 60.0))
        self.backend: str | None = None
        self.workers: list[dict] = []  # one dict per rank: rank, engine_id, host, pid, ...
        self._ipp: ipp.Cluster | None = None
        self.client: ipp.Client | None = None
        self.view = None  # DirectView on the ranks, in rank order (used by %%px)
        self._rendezvous = None
        self._horovod_env: dict = {}   # extra HOROVOD_* settings (start_horovod(env=...)), kept across resize
        self._horovod_ran: dict = {}   # engine pid -> the settings Horovod last started with in it
        self._controller_pid: int | None = None
        self._engine_pids: set[int] = set()
        if start:
            self.start()

    # ------------------------------------------------------------------ life cycle
    def start(self) -> "Cluster":
        """Start (or connect to) the engines and form the process group."""
        if self.client is not None:
            return self
        t0, laps = time.monotonic(), local_engines.Laps()
        _live_clusters.add(self)
        try:
            if self._connect:
                self._connect_existing()
                laps.lap("connect")
            else:
                self._start_local(self.n, laps.lap)
            self._form_world(self._engine_ids()[:self.n], laps.lap)  # n=None: all
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - t0
        self.startup_phases = laps.phases  # seconds per phase of this start (ddnb/runtime/local_engines.py)
        return self

    def _start_local(self, n: int, lap=local_engines.no_lap) -> None:
        self._ipp, self.client, self._controller_pid = local_engines.start_controller(self.start_timeout)
        lap("controller")
        self._add_engines(n)
        lap("engines")

    def _add_engines(self, k: int) -> None:
        threads = worker.threads_for(len(self._engine_ids()) + k, self.threads)
        new, zygote = local_engines.start_engines(self._ipp, self.client, k, threads, self.start_timeout)
        also_kill = (self._controller_pid,) if self._controller_pid else ()
        self._engine_pids.update(zygote, self._await([self.client[e].apply_async(worker.watch_parent, os.getpid(),
                                                                         also_kill) for e in new],
                                             new, "watch_parent", self.start_timeout))

    def _connect_existing(self) -> None:
        self._ipp, self.client = local_engines.connect_ipcluster(self.profile, self.cluster_id, self.profile_dir,
                                                                 self.n or 1, self.start_timeout)

    def _engine_ids(self) -> list[int]:
        return sorted(self.client.ids) if self.client is not None else []

    def _form_world(self, engine_ids: list[int], lap=local_engines.no_lap) -> None:
        """Assign ranks, choose the backend, initialize torch.distributed (and Horovod)."""
        infos = self._await([self.client[e].apply_async(worker.describe) for e in engine_ids],
                            engine_ids, "describe", self.start_timeout)
        lap("describe")   # the engines' first task: it waits for their torch import
        self.workers = assign_ranks(engine_ids, infos)
        engine_ids, hosts = [w["engine_id"] for w in self.workers], [w["host"] for w in self.workers]
        world = len(engine_ids)
        self.backend, note = choose_backend(self.backend_requested, hosts, [w["gpus"] for w in self.workers],
                                            emulated=self.emulate is not None)
        if note:
            warnings.warn(note, stacklevel=3)
        self.n = world
        single_host = len(set(hosts)) == 1
        addr = self.master_addr or ("127.0.0.1" if single_host else hosts[0])
        threads = self._run_engines(worker.limit_threads, [(hosts.count(h), self.threads) for h in hosts],
                                    "limit_threads", timeout=self.start_timeout)   # each on its own host's cores
        port = self._await([self.client[engine_ids[0]].apply_async(worker.open_store, world, self.timeout)],
                           engine_ids[:1], "open_store", self.start_timeout)[0]
        args = [(w["rank"], world, self.backend, addr, port, w["local_rank"], self.timeout) for w in self.workers]
        done = self._run_engines(worker.init_process_group, args, "init_process_group", timeout=self.start_timeout)
        for w, d, t in zip(self.workers, done, threads):
            w.update(backend=d["backend"], device=d["device"], threads=t)
        lap("process_group")
        if self.horovod:
            self._init_horovod(hosts, single_host, self._horovod_env)
            lap("horovod")
        if self.emulate is not None:
            if not single_host:
                raise ValueError("emulate needs every worker on this host: the emulated clock is this machine's")
            self._run_engines(worker.start_emulation, [(self.emulate.to_dict(), time.monotonic() + 0.05)] * world,
                              "emulate", timeout=self.start_timeout)
            lap("emulate")
        self.view = self.client[engine_ids]
        self.view.block = True
        self._push_names()
        px.enable(self)
        lap("names")

    def _init_horovod(self, hosts: list[str], single_host: bool, env: dict | None = None) -> None:
        if self._rendezvous is not None:
            self._rendezvous.stop()
        addr = "127.0.0.1" if single_host else horovod_rt.this_host_address()
        self._rendezvous = horovod_rt.HorovodRendezvous(hosts, addr=addr, timeout=self.timeout)
        iface = "lo" if single_host else None
        extra = {k: str(v) for k, v in (env or {}).items()}
        envs = [({**self._rendezvous.env(r, iface), **extra},) for r in range(self.n)]
        got = self._run_engines(worker.init_horovod, envs, "hvd.init", timeout=self.start_timeout)
        self._horovod_ran.update({w["pid"]: extra for w in self.workers})
        for w, g in zip(self.workers, got):
            if g["rank"] != w["rank"]:
                raise ClusterError(f"Horovod gave rank {g['rank']} to torch rank {w['rank']}")

    def start_horovod(self, env: dict | None = None) -> "Cluster":
        """Initialize Horovod on the running workers (as `horovod=True` does at start).
        `env` adds Horovod settings read at hvd.init(), e.g. {"HOROVOD_FUSION_THRESHOLD":
        0, "HOROVOD_CYCLE_TIME": 5}. To change them: stop_horovod(), restart(), then
        start_horovod(env=...); other settings in the same engines are refused
        (`ddnb.runtime.horovod.check_settings` says why)."""
        if self.horovod:
            return self
        if not horovod_rt.horovod_available():
            raise ValueError("Horovod with PyTorch is not installed (run `make lab` or scripts/install_horovod.sh)")
        horovod_rt.check_settings(env, {w["rank"]: self._horovod_ran.get(w["pid"]) for w in self.workers})
        hosts = [w["host"] for w in self.workers]
        self.horovod, self._horovod_env = True, dict(env or {})
        self._init_horovod(hosts, len(set(hosts)) == 1, self._horovod_env)
        self._push_names()
        return self

    def stop_horovod(self) -> "Cluster":
        """Shut Horovod down on the workers, keeping torch.distributed. Horovod's background
        thread polls even when idle (about a fifth of a core per worker here), which slows
        everything else measured on a machine with few cores."""
        if self.horovod:
            self._run_engines(horovod_rt.shutdown_on_worker, [()] * self.n, "hvd.shutdown")
            if self._rendezvous is not None:
                self._rendezvous.stop()
                self._rendezvous = None
            self.horovod = False
        return self

    def _push_names(self) -> None:
        """Give every engine the names a %%px cell expects: rank, world_size, local_rank,
        device, backend, and the usual imports."""
        pushes = [({"rank": w["rank"], "world_size": self.n, "local_rank": w["local_rank"],
                    "backend": self.backend},) for w in self.workers]
        self._run_engines(worker.push_namespace, [p + (self.horovod,) for p in pushes], "push", timeout=self.start_timeout)

    def resize(self, n: int, state: str | None = None) -> "Cluster":
        """n workers, the process group (and Horovod) re-formed; `state`: see `ddnb.elastic.resize`."""
        if state is not None:   # checkpoint, resize, reshard: ddnb.elastic.resize
            return __import__("ddnb.elastic.resize", fromlist=["resize"]).resize(self, n, state)
        check_n(n)
        if self.client is None:
            raise ClusterError("the cluster is stopped; call start() first")
        if n == self.n:
            return self
        self._run_engines(worker.shutdown, [()] * self.n, "shutdown")
        have = self._engine_ids()
        if n > len(have):
            if self._connect:
                raise ValueError(f"the connected ipcluster has {len(have)} engines; cannot resize to {n}")
            self._add_engines(n - len(have))
        elif n < len(have) and not self._connect:
            extra = have[n:]
            self._shutdown_engines(extra)
        self._form_world(self._engine_ids()[:n])
        return self

    def restart(self) -> "Cluster":
        """Stop everything (e.g. after a lost worker) and start again with the same size."""
        self.stop()  # keeps self.n
        return self.start()

    def _shutdown_engines(self, engine_ids: list[int]) -> None:
        pids = [w["pid"] for w in self.workers if w["engine_id"] in engine_ids]
        with contextlib.suppress(Exception):   # no waiting on replies: a lost one must not hang us
            self.client.shutdown(targets=engine_ids, block=False)
        _reap(pids, wait=5, grace=min(5.0, self.timeout))
        self._engine_pids.difference_update(pids)
        deadline = time.monotonic() + self.timeout
        while set(engine_ids) & set(self.client.ids) and time.monotonic() < deadline:
            time.sleep(0.05)

    def stop(self) -> None:
        """Shut the workers down: leave Horovod and the process group, stop the engines and
        the controller we started, stop the rendezvous server. Idempotent."""
        _live_clusters.discard(self)
        if self.client is not None and self.workers and self.alive():
            try:  # a clean goodbye when everyone can still answer
                ars = [self.client[w["engine_id"]].apply_async(worker.shutdown) for w in self.workers]
                for ar in ars:
                    ar.wait(min(5.0, self.timeout))
            except Exception:
                pass
        if self._rendezvous is not None:
            self._rendezvous.stop()
            self._rendezvous = None
        if self._ipp is not None and not self._connect:
            with _quiet(), contextlib.suppress(Exception):
                self._ipp.stop_cluster_sync()
            _reap(self.pids(), wait=5)
            if self._controller_pid:  # the controller's schedulers live in its process group
                worker.kill_group(self._controller_pid)
        if self.client is not None:
            with contextlib.suppress(Exception):
                self.client.close()
        self.client = self.view = self._ipp = None
        self._engine_pids, self._controller_pid = set(), None

    def table(self):
        """One row per rank: where it runs and what it runs with (a pandas DataFrame)."""
        import pandas as pd

        cols = ["rank", "local_rank", "engine_id", "host", "pid", "device", "backend", "torch", "horovod"]
        rows = [{c: w.get(c) for c in cols} for w in self.workers]
        for row in rows:
            row["horovod"] = row["horovod"] if self.horovod else None
        return pd.DataFrame(rows, columns=cols).set_index("rank")

    def pids(self) -> list[int]:
        """Process ids of the processes this cluster started: engines (and the zygote that forked
        them), the controller and the scheduler processes the controller forked."""
        pids = set(self._engine_pids)
        if self._controller_pid:
            pids.add(self._controller_pid)
            with contextlib.suppress(psutil.Error):
                pids.update(c.pid for c in psutil.Process(self._controller_pid).children(recursive=True))
        return sorted(pids)

    def alive(self) -> bool:
        return self.client is not None and not self._dead_ranks(range(len(self.workers)))

    def __enter__(self) -> "Cluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def emulation_report(self) -> str:
        """Real mode, or whether every emulated operation kept to its model (`ddnb.emulate.summary`)."""
        from ddnb.emulate import report, summary

        return summary(self.run(report)) if self.emulate is not None else "real mode: nothing emulated"

    def __repr__(self) -> str:
        state = f"{self.n} workers, backend={self.backend}" + (", horovod" if self.horovod else "")
        state += f", emulated '{self.emulate.name}'" if self.emulate is not None else ""
        return f"<ddnb.Cluster {state}{'' if self.client else ', stopped'}>"

    # ------------------------------------------------------------------ running code
    def run(self, fn, *args, **kwargs) -> list:
        """Call fn(*args, **kwargs) on every rank at once; returns the results in rank order.

        Raises WorkerError (a rank raised: its rank and remote traceback),
        WorkerLostError (a worker process died) or WorkerTimeoutError (ranks that did not
        finish within `timeout`), never hangs.
        """
        return self._run_engines(fn, [args] * self.n, getattr(fn, "__name__", "fn"), kwargs)

    def run_ranks(self, fn, per_rank_args: list[tuple], **kwargs) -> list:
        """Like run, with arguments of its own for each rank: fn(*per_rank_args[rank])."""
        if len(per_rank_args) != self.n:
            raise ValueError(f"{len(per_rank_args)} argument tuples for {self.n} ranks")
        return self._run_engines(fn, per_rank_args, getattr(fn, "__name__", "fn"), kwargs)

    def run_surviving(self, fn, *args, **kwargs) -> list:
        """Like run, for code that is meant to outlive a worker (an asynchronous parameter
        server): a rank whose process dies does not end the wait. The other ranks' results
        come back in rank order, a `LostWorker(rank, where)` in place of each dead one's.
        A rank that raises still raises WorkerError, and a rank that does not finish within
        `timeout` WorkerTimeoutError. Afterwards the cluster has lost those workers:
        `cluster.alive()` is False until `cluster.restart()`."""
        return self._run_engines(fn, [args] * self.n, getattr(fn, "__name__", "fn"), kwargs, allow_lost=True)

    def _run_engines(self, fn, per_rank_args, what, kwargs=None, timeout=None, allow_lost=False):
        if self.client is None:
            raise ClusterError("the cluster is stopped; call start() first")
        dead = self._dead_ranks(range(len(self.workers)))
        if dead:
            raise WorkerLostError(dead, f"rank(s) {', '.join(map(str, dead))} of this cluster died earlier "
                                        f"({'; '.join(self._where(self.workers[r]['engine_id']) for r in dead)}): "
                                        f"call cluster.restart() before running {what}")
        eids = [w["engine_id"] for w in self.workers]
        fn = worker.resumed(fn) if self.emulate is not None else fn   # idle time between tasks is not work
        ars = [self.client[e].apply_async(fn, *a, **(kwargs or {})) for e, a in zip(eids, per_rank_args)]
        return self._await(ars, eids, what, timeout, allow_lost)

    def _await(self, ars, engine_ids, what, timeout=None, allow_lost=False):
        """Wait for one AsyncResult per rank (`ddnb.runtime.waiting.await_ranks`)."""
        ranks_of = {w["engine_id"]: w["rank"] for w in self.workers}
        return await_ranks(ars, engine_ids, ranks_of, what, timeout or self.timeout,
                           is_dead=self._engine_dead, where=self._where, allow_lost=allow_lost)

    def _where(self, engine_id) -> str:
        for w in self.workers:
            if w["engine_id"] == engine_id:
                return f"engine {engine_id}, pid {w['pid']} on {w['host']}"
        return f"engine {engine_id}"

    def _engine_dead(self, engine_id) -> bool:
        if engine_id not in self.client.ids:  # unregistered by the controller's heartbeat
            return True
        for w in self.workers:
            if w["engine_id"] == engine_id and w["pid"] in self._engine_pids:
                return not pid_alive(w["pid"])
        return False

    def _dead_ranks(self, ranks) -> list[int]:
        return [r for r in ranks if self._engine_dead(self.workers[r]["engine_id"])]

