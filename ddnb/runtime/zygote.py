"""Local engines forked from one process that has already imported torch: a fork server
(Android's "zygote", multiprocessing's "forkserver").

Why: started one by one, every engine imports torch, ipyparallel and, at its first
optimizer step, torch._dynamo (torch.optim's `step` is wrapped by it): about 2 s of CPU per
process, measured (torch 0.8 s, torch._dynamo 0.9 s, ipyparallel 0.1 s). Sixteen engines on
two cores spent ~15 s importing the same modules. Here one process imports them once and
forks the engines; each child starts with those modules in memory (shared copy-on-write,
so 16 engines also take less memory), reseeds its random generators (a forked child would
otherwise draw the same "random" numbers as its siblings), and runs an ipyparallel engine.

Safe because nothing the fork copies is running: the zygote starts no thread of its own,
creates no zmq context or event loop, and never touches CUDA (it checks, and refuses, so a
GPU engine initializes CUDA in its own process, as a spawned one does). Linux only (the
default there); DDNB_ENGINE_START=spawn, macOS and Windows spawn the engines one by one
(`local_engines.start_engines`).

The zygote lives as long as its engines and reaps them. When the process that started it
(the notebook's kernel) is gone, each engine notices (`worker.watch_parent`), takes the
controller with it and exits; the zygote kills any engine still there 5 s later, and exits. Taught in `notebooks/00_getting_started.ipynb`.
"""
from __future__ import annotations

import os
import signal
import sys
import time

PRELOAD = ("torch", "torch.distributed", "torch.nn.functional", "torch.optim", "torch._dynamo",
           "cloudpickle", "ipyparallel.engine.app", "ddnb.runtime.worker")


IMPORT_TIME_ENV = ("ATEN_CPU_CAPABILITY", "LD_PRELOAD", "PYTHONHASHSEED", "MALLOC_CONF", "TORCH_CPP_LOG_LEVEL")
_server_env: dict | None = None     # IMPORT_TIME_ENV when this process's fork server started


def usable() -> bool:
    """Whether processes are forked here: on Linux, unless DDNB_ENGINE_START=spawn. Used for
    `ddnb.Cluster`'s local engines and `ddnb.runtime.world.World`'s ranks."""
    return sys.platform.startswith("linux") and os.environ.get("DDNB_ENGINE_START", "fork") != "spawn"


def mp_context():
    """The multiprocessing context `ddnb.runtime.world.World` starts its ranks with: with
    Linux the standard library's fork server with the same modules preloaded (started once per
    process, reused by every later World); "spawn" elsewhere or with DDNB_ENGINE_START=spawn.
    Each rank takes the parent's environment as it is at the World's start; variables that
    act when torch is imported (IMPORT_TIME_ENV) cannot change in a process that has it
    already, so when they differ from the fork server's, this World's ranks are spawned."""
    import multiprocessing as mp

    global _server_env
    now = {k: os.environ.get(k) for k in IMPORT_TIME_ENV}
    if not usable() or _server_env not in (None, now):
        return mp.get_context("spawn")
    _server_env = now
    ctx = mp.get_context("forkserver")
    # "ddnb.testing" (it imports ddnb.runtime.world) also names the server and the ranks it forks
    # on their command line, where conditions.CLUSTER_MARKERS finds them
    ctx.set_forkserver_preload([m for m in PRELOAD if not m.startswith("ipyparallel")] + ["ddnb.testing"])
    return ctx


def command(k: int, parent: int, engine_args: list[str]) -> list[str]:
    """The command line that starts a zygote for k engines of `parent`'s cluster."""
    return [sys.executable, "-m", "ddnb.runtime.zygote", str(k), str(parent), "--", *engine_args]


def _engine(engine_args: list[str]) -> None:
    """In a forked child: fresh random state, then an ipyparallel engine until shutdown;
    then SystemExit, which ends this process (it never returns)."""
    import random

    import torch

    random.seed()
    torch.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    sys.argv = ["ipengine", *engine_args]
    from ipyparallel.engine.app import IPEngine

    try:
        IPEngine.launch_instance(argv=engine_args)
    except SystemExit:
        raise
    except BaseException:
        import traceback

        traceback.print_exc()
        raise SystemExit(1) from None
    # Leave as a spawned engine does, through the interpreter's exit (never back into the
    # zygote's loop: SystemExit unwinds `main`), so that zmq sends what is still queued. An
    # os._exit here dropped the engine's shutdown_reply now and then, and the kernel's
    # Client.shutdown(block=True) waited for it forever (tests/test_browser.py hung at a resize).
    raise SystemExit(0)


def main(argv: list[str]) -> int:
    k, parent, engine_args = int(argv[0]), int(argv[1]), argv[3:]
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    import torch

    if torch.cuda.is_initialized():   # a child could not use CUDA; never the case today
        print("ddnb zygote: CUDA was initialized while importing; engines must be spawned", file=sys.stderr)
        return 3
    children = set()
    for _ in range(k):
        pid = os.fork()
        if pid == 0:
            _engine(engine_args)
        children.add(pid)
    while children:
        if os.getppid() != parent:   # the kernel is gone: each engine notices (worker.watch_parent)
            deadline = time.monotonic() + 5.0   # and takes the controller with it; kill stragglers
            while children and time.monotonic() < deadline:
                pid = os.waitpid(-1, os.WNOHANG)[0]
                children.discard(pid) if pid else time.sleep(0.1)
            for pid in children:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            return 1
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid:
            children.discard(pid)
        else:
            time.sleep(0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
