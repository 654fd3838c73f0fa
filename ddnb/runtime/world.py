"""`World`: N processes in one torch.distributed process group, kept alive across calls.
Tests and benches import it from its public façade, `ddnb.testing`:

    from ddnb.testing import World, run_world

Each rank is a process forked from the standard library's fork server with torch imported
(Linux; `ddnb.runtime.zygote.mp_context`; spawned elsewhere or with DDNB_ENGINE_START=spawn),
with cores / n intra-op threads, at least 1
(`ddnb.runtime.worker.threads_for`; `threads=` or $DDNB_THREADS overrides it), joined
through a FileStore in a fresh temporary folder (no port to collide). `World(n)` keeps
the processes (and their process group) alive across calls, which is what makes
hundreds of multi-process tests cheap on 2 cores; `run_world` is the one-shot form.
Every call has a deadline: a rank that raises, dies or hangs becomes WorkerError /
WorkerLostError / WorkerTimeoutError naming it, and a world that timed out is killed,
never left blocking.
No notebook teaches it: it is the harness of tests/ and of `ddnb.bench`; notebooks use
`ddnb.Cluster` (`notebooks/00_getting_started.ipynb`).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time
import traceback
from multiprocessing.connection import wait

import cloudpickle

from ddnb._checks import Checks
from ddnb.runtime import zygote
from ddnb.runtime.errors import ClusterError, WorkerError, WorkerLostError, WorkerTimeoutError
from ddnb.runtime.worker import GPU_BACKEND

# After a rank raises, how long the others get to finish before the world is declared
# broken (they may be blocked in a collective that the failed rank never joined).
ERROR_GRACE_SECONDS = 2.0


def _rank_main(rank, world_size, store_dir, conn, threads, timeout, hvd_env, backend="gloo", environ=None):
    """The loop of one rank: receive a pickled (fn, args, kwargs), run it, send the result.
    `environ`: the parent's environment when the World started (a rank forked from the fork
    server would otherwise have the server's, from the first World's start)."""
    if environ is not None:
        os.environ.clear()
        os.environ.update(environ)
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from ddnb.runtime.worker import limit_threads

    limit_threads(world_size, threads)   # threads: World's, already resolved by threads_for
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    if torch.cuda.is_available():   # one GPU per rank where there are enough (nccl needs it)
        torch.cuda.set_device(rank % torch.cuda.device_count())
    store = dist.FileStore(os.path.join(store_dir, "store"), world_size)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout))
    if hvd_env is not None:
        from ddnb.runtime.worker import init_horovod

        init_horovod(hvd_env)
    conn.send(("ready", None))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):  # the parent is gone, or its kernel shuts down
            break
        if msg is None:
            break
        try:
            fn, args, kwargs = cloudpickle.loads(msg)
            _resume_emulation()
            reply = ("ok", cloudpickle.dumps(fn(*args, **kwargs)))
        except BaseException as e:  # noqa: BLE001 - report everything to the parent
            reply = ("err", f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
        try:
            conn.send(reply)
        except OSError:  # the parent gave up on this world (a peer died): leave quietly
            os._exit(1)
    if hvd_env is not None:
        import horovod.torch as hvd

        hvd.shutdown()
    dist.destroy_process_group()


@contextlib.contextmanager
def _main_not_reimported():
    """Spawned ranks need nothing from the parent's __main__ (functions travel by value
    with cloudpickle), so do not let multiprocessing re-run it in each child: a script
    without an `if __name__ == "__main__":` guard would otherwise start worlds recursively."""
    main = sys.modules.get("__main__")
    saved_file, saved_spec = getattr(main, "__file__", None), getattr(main, "__spec__", None)
    try:
        if saved_file is not None:
            del main.__file__
        main.__spec__ = None
        yield
    finally:
        if saved_file is not None:
            main.__file__ = saved_file
        main.__spec__ = saved_spec


BACKENDS = ("gloo", "nccl", GPU_BACKEND, "auto")


def check_backend(backend: str, n: int, gpus: int | None = None) -> str:
    """The backend a World of n ranks forms, refusing before any process starts one that
    this machine (`gpus` CUDA devices, default: counted) cannot give them: nccl needs one
    CUDA device per rank (two ranks on one GPU fail in ncclCommInitRank). "auto" is
    GPU_BACKEND ("cpu:gloo,cuda:nccl") with a GPU per rank, else gloo, as in `ddnb.Cluster`;
    "nccl" stays pure nccl (CPU tensors then fail)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "gloo":
        return backend
    if gpus is None:
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "auto":
        return GPU_BACKEND if gpus >= n else "gloo"
    if gpus < n:
        raise ValueError(f"backend={backend!r} needs one CUDA device per rank: {n} ranks, {gpus} device(s) here; "
                         f"use backend='gloo' (CUDA tensors travel through the host) or fewer ranks")
    return backend


def _resume_emulation() -> None:
    emulate = sys.modules.get("ddnb.emulate.clock")   # only if this rank emulates
    if emulate is not None:
        emulate.resume()


def _activate_emulation(profile: dict, epoch: float) -> str:
    import torch.distributed as dist

    from ddnb.emulate import activate

    return activate(profile, dist.get_rank(), dist.get_world_size(), epoch)


class World:
    """N live processes in one process group (gloo by default; "nccl", "cpu:gloo,cuda:nccl"
    or "auto" as `check_backend` says, with one GPU per rank), and optionally Horovod.
    `World.backend` is the backend formed. Where CUDA is available rank r uses device
    r % device_count, so CUDA tensors work with any backend; `ddnb.runtime.worker.rank_device()`
    on a rank is the device its tensors belong on."""

    def __init__(self, n: int, timeout: float = 60, horovod: bool = False, threads: int | None = None,
                 backend: str = "gloo", emulate=None):
        from ddnb.runtime.worker import threads_for

        with Checks("World") as check:
            check.integer("n", n, min=1, why=" (ranks)")
            check.number("timeout", timeout, positive=True, why=" (seconds)")
            check.integer("threads", threads, min=1, none=True)
            profile = None
            if emulate is not None:
                from ddnb.runtime.placement import emulated_profile

                profile = emulated_profile(emulate, check, n)
                check.rule(not horovod, "emulate with horovod=True: Horovod is not emulated (its collectives "
                                        "would run at real speed)")
        self.threads = threads_for(n, threads)   # intra-op threads of every rank
        if profile is not None and backend != "gloo":
            import warnings

            from ddnb.runtime.placement import EMULATED_ON_GLOO

            warnings.warn(f"World(backend={backend!r}, emulate=...): {EMULATED_ON_GLOO}", stacklevel=2)
            backend = "gloo"
        self.backend = backend = check_backend(backend, n)
        self.n, self.timeout, self.horovod = n, timeout, horovod
        self.broken = False
        self._dir = tempfile.mkdtemp(prefix="ddnb-world-")
        self._rendezvous = None
        envs = [None] * n
        if horovod:
            from ddnb.runtime.horovod import HorovodRendezvous

            self._rendezvous = HorovodRendezvous(["localhost"] * n, timeout=timeout)
            envs = [self._rendezvous.env(r, iface="lo") for r in range(n)]
        ctx = zygote.mp_context()   # forked from a process that has torch loaded
        self._conns, self._procs = [], []
        with _main_not_reimported():
            for rank in range(n):
                parent, child = ctx.Pipe()
                p = ctx.Process(target=_rank_main, name=f"ddnb-rank{rank}", daemon=True,
                                args=(rank, n, self._dir, child, self.threads, timeout, envs[rank], backend,
                                      dict(os.environ)))
                p.start()
                child.close()
                self._conns.append(parent)
                self._procs.append(p)
        self._collect(["ready"] * n, "start-up", timeout)
        self.emulate = profile
        if profile is not None:
            self.run(_activate_emulation, profile.to_dict(), time.monotonic() + 0.05)

    def emulate_as(self, profile) -> None:
        """From now on the same processes are an emulated cluster of `profile` (a name or a
        `Profile`, scaled as in the constructor), or real mode with None: one World can
        then compare profiles without starting new processes."""
        from ddnb.emulate import deactivate

        if profile is None:
            self.run(deactivate)
            self.emulate = None
            return
        from ddnb.runtime.placement import emulated_profile

        with Checks("World.emulate_as") as check:
            profile = emulated_profile(profile, check, self.n)
            check.rule(not self.horovod, "emulate with horovod=True: Horovod is not emulated")
        self.run(_activate_emulation, profile.to_dict(), time.monotonic() + 0.05)
        self.emulate = profile

    def emulation_reports(self) -> list:
        """Each rank's `ddnb.emulate.report()` (None per rank in real mode)."""
        from ddnb.emulate import report

        return self.run(report)

    def run(self, fn, *args, timeout: float | None = None, **kwargs) -> list:
        """fn(*args, **kwargs) on every rank; the results in rank order."""
        return self.run_ranks(fn, [args] * self.n, timeout=timeout, **kwargs)

    def run_ranks(self, fn, per_rank_args, timeout: float | None = None, **kwargs) -> list:
        """fn(*per_rank_args[rank], **kwargs) on every rank."""
        if self.broken:
            raise ClusterError("this World is broken by an earlier failure; make a new one")
        if len(per_rank_args) != self.n:
            raise ValueError(f"{len(per_rank_args)} argument tuples for {self.n} ranks")
        for conn, a in zip(self._conns, per_rank_args):
            conn.send(cloudpickle.dumps((fn, tuple(a), kwargs)))
        got = self._collect(None, getattr(fn, "__name__", "fn"), timeout or self.timeout)
        return [cloudpickle.loads(g) for g in got]

    def _collect(self, expect, what, timeout):
        deadline = time.monotonic() + timeout
        results, errors = [None] * self.n, {}
        pending = set(range(self.n))
        grace_end = None
        while pending:
            now = time.monotonic()
            end = deadline if grace_end is None else min(deadline, grace_end)
            if now >= end:
                break
            waitables = [self._conns[r] for r in pending] + [self._procs[r].sentinel for r in pending]
            for obj in wait(waitables, timeout=end - now):
                r = next((r for r in pending if obj in (self._conns[r], self._procs[r].sentinel)), None)
                if r is None:
                    continue
                try:
                    kind, payload = self._conns[r].recv() if self._conns[r].poll() else ("lost", None)
                except (EOFError, OSError):
                    kind, payload = "lost", None
                if kind == "lost":
                    self._procs[r].join(1)
                    code = self._procs[r].exitcode
                    self.close(kill=True)
                    raise WorkerLostError([r], f"rank {r} (pid {self._procs[r].pid}) died with exit code "
                                               f"{code} while running {what}")
                pending.discard(r)
                if kind == "err":
                    errors[r] = payload
                    grace_end = grace_end or time.monotonic() + ERROR_GRACE_SECONDS
                else:
                    results[r] = payload
        if pending:
            self.close(kill=True)
            if errors:
                first = min(errors)
                raise WorkerError(first, f"rank {first} raised while running {what} (ranks {sorted(errors)} "
                                         f"raised; ranks {sorted(pending)} were still blocked):\n{errors[first]}")
            raise WorkerTimeoutError(sorted(pending), f"ranks {sorted(pending)} did not finish {what} within "
                                                      f"{timeout:.0f} s; the world was killed")
        if errors:
            first = min(errors)
            raise WorkerError(first, f"rank {first} raised while running {what} (ranks {sorted(errors)} raised):\n"
                                     f"{errors[first]}")
        return results

    def close(self, kill: bool = False) -> None:
        """Stop every rank (kill=True: without waiting for a clean exit)."""
        self.broken = True
        for conn in self._conns:
            try:
                if not kill:
                    conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        for p in self._procs:
            if kill:
                p.kill()
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        for conn in self._conns:
            conn.close()
        if self._rendezvous is not None:
            self._rendezvous.stop()
            self._rendezvous = None
        shutil.rmtree(self._dir, ignore_errors=True)

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def __enter__(self) -> "World":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run_world(n: int, fn, *args, timeout: float = 60, horovod: bool = False, **kwargs) -> list:
    """Start a world of n ranks, run fn(*args, **kwargs) on each, stop it; results in rank order."""
    with World(n, timeout=timeout, horovod=horovod) as world:
        return world.run(fn, *args, **kwargs)
