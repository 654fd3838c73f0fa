"""What runs inside each worker process (an ipyparallel engine, or a process spawned by
`ddnb.runtime.world`) to make it a rank of a torch.distributed world and, optionally, of Horovod.

The notebook side (`ddnb.runtime.cluster`) decides everything (rank, backend, addresses) and calls
these functions on the engines; they only act on the process they run in. Taught in
`notebooks/00_getting_started.ipynb`.
"""
from __future__ import annotations

import os
import socket
import sys
import threading
import time
from datetime import timedelta

from ddnb._checks import Checks, is_int

# The rendezvous store of rank 0, kept alive for the lifetime of the process group.
_store = None

# One GPU per rank: gloo carries CPU tensors and nccl CUDA tensors, in one process group
# (torch.distributed picks the backend by the tensor's device), so a notebook's CPU
# all-reduce and its CUDA training both work. Pure "nccl" fails on CPU tensors.
GPU_BACKEND = "cpu:gloo,cuda:nccl"


def rank_device():
    """The device this rank's tensors belong on (`ddnb.collectives.devices.rank_device`, the
    one rule), reachable from the runtime as engine code and the notebooks reach it."""
    from ddnb.collectives.devices import rank_device as rule

    return rule()


THREADS_ENV = "DDNB_THREADS"   # the user's override of `threads_for`, e.g. DDNB_THREADS=1 horovodrun ...


def available_cores() -> int:
    """The cores this process may run on: its CPU affinity (taskset, a container's
    cpuset, a batch scheduler's allocation) where the OS reports it, else os.cpu_count()."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def threads_for(local_ranks: int, threads: int | None = None) -> int:
    """The intra-op threads of one of `local_ranks` ranks on this host: `threads` if given,
    else $DDNB_THREADS if set, else available_cores() // local_ranks, at least 1. N ranks
    on N cores then use one core each instead of all fighting over every core (and over
    the cores Horovod's and gloo's own threads need)."""
    if threads is None and os.environ.get(THREADS_ENV, "").strip():
        text = os.environ[THREADS_ENV].strip()
        threads = int(text) if text.isdigit() else -1
        where = f"${THREADS_ENV}={text!r}"
    else:
        where = f"threads={threads!r}"
    with Checks("threads_for") as check:
        if threads is not None:
            check.rule(is_int(threads) and threads >= 1, f"{where}: intra-op threads must be an integer >= 1")
        else:
            check.integer("local_ranks", local_ranks, min=1)
    return threads if threads is not None else max(1, available_cores() // local_ranks)


def limit_threads(local_ranks: int = 1, threads: int | None = None) -> int:
    """Size this process's intra-op threads by `threads_for` (torch.set_num_threads, and
    OMP/MKL/OpenBLAS_NUM_THREADS for libraries loaded later and processes started from
    here). Every process ddnb starts or runs in calls it: engines, `ddnb.runtime.world` ranks,
    `ddnb.launch` under torchrun or horovodrun. Returns the thread count."""
    threads = threads_for(local_ranks, threads)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(threads)
    import torch

    torch.set_num_threads(threads)
    return threads


def describe() -> dict:
    """Facts about this process, gathered from every engine before ranks are assigned."""
    info = {"host": socket.gethostname(), "pid": os.getpid(), "python": sys.version.split()[0]}
    try:
        import torch

        info["torch"] = torch.__version__
        info["gpus"] = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        info["torch"], info["gpus"] = None, 0
    try:
        import horovod

        info["horovod"] = horovod.__version__
    except ImportError:
        info["horovod"] = None
    return info


def watch_parent(parent_pid: int, also_kill: tuple = (), interval: float = 1.0) -> int:
    """Exit this process (and kill `also_kill`, e.g. the controller) as soon as the
    process that launched it is gone: a notebook kernel killed with SIGKILL runs no
    clean-up of its own, and this keeps its engines from living on as orphans. An engine
    forked by `ddnb.runtime.zygote` has the zygote as its parent: it exits when the zygote
    does, and the zygote exits when `parent_pid` is gone. Returns this process's pid."""
    from ddnb.runtime.waiting import pid_alive

    launcher = os.getppid()   # parent_pid, or the zygote it started

    def loop():
        while True:
            time.sleep(interval)
            # a kernel killed while its parent (nbval, a test runner) is still tearing down
            # is a zombie for a while: it answers kill(pid, 0), but it is gone
            alive = pid_alive(parent_pid) and os.getppid() == launcher
            if not alive:
                for pid in also_kill:
                    kill_group(pid)
                os._exit(1)

    threading.Thread(target=loop, name="ddnb-watch-parent", daemon=True).start()
    return os.getpid()


def kill_group(pid: int) -> None:
    """SIGKILL `pid` and, when it leads its own process group (ipyparallel starts the
    controller in a new session, and the controller forks its schedulers into it), every
    process of that group, so that none is left behind as an orphan."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, 9)
        else:
            os.kill(pid, 9)
    except OSError:
        pass


def open_store(world_size: int, timeout: float) -> int:
    """On rank 0: open the TCP rendezvous store on a port the OS chooses; returns it."""
    global _store
    import torch.distributed as dist

    _store = dist.TCPStore("0.0.0.0", 0, world_size, is_master=True,
                           timeout=timedelta(seconds=timeout), wait_for_workers=False)
    return _store.port


def init_process_group(rank: int, world_size: int, backend: str, master_addr: str,
                       master_port: int, local_rank: int, timeout: float) -> dict:
    """Join the torch.distributed world with `backend` ("gloo", "nccl" or GPU_BACKEND);
    with nccl in it, this process uses cuda:local_rank (`device_for`), which it returns as
    "device". Every collective then times out after `timeout` seconds instead of gloo's
    default 30 minutes, so a lost peer cannot hang a rank."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    store = _store if rank == 0 else dist.TCPStore(
        master_addr, master_port, world_size, is_master=False, timeout=timedelta(seconds=timeout))
    from ddnb.collectives.devices import device_for

    device = device_for(backend, local_rank)
    if device.type == "cuda":
        # no device_id: with it nccl starts eagerly and runs every unbatched send/recv of a
        # group on one communicator, in order, so one posted receive (a parameter server
        # listening to its workers) would hold back every other message of the group
        torch.cuda.set_device(device)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout))
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(local_rank),
                      MASTER_ADDR=master_addr, MASTER_PORT=str(master_port))
    return {"rank": dist.get_rank(), "world_size": dist.get_world_size(),
            "backend": dist.get_backend(), "device": str(device)}


# The environment variables the last init_horovod set: Horovod reads its settings from the
# environment at hvd.init(), so a setting of one start (HOROVOD_FUSION_THRESHOLD=0) must not
# leak into the next one, which did not ask for it.
_horovod_keys: set = set()


def init_horovod(env: dict) -> dict:
    """Initialize Horovod over Gloo from the environment `ddnb.runtime.horovod.HorovodRendezvous.env`
    made for this rank (what horovodrun would otherwise set), plus any extra HOROVOD_*
    settings; those of a previous start that `env` does not set again are removed first."""
    for key in _horovod_keys - set(env):
        os.environ.pop(key, None)
    _horovod_keys.clear()
    _horovod_keys.update(env)
    os.environ.update({k: str(v) for k, v in env.items()})
    import horovod.torch as hvd

    hvd.init()
    return {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank()}


def shutdown() -> None:
    """Leave Horovod and the process group (used before a resize and at stop)."""
    global _store
    if "horovod.torch" in sys.modules:
        import horovod.torch as hvd

        try:
            if hvd.is_initialized():
                hvd.shutdown()
        except ValueError:
            pass
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    _store = None


def push_namespace(names: dict, horovod: bool) -> None:
    """Runs on an engine: put rank, world_size, ... and the usual imports in the namespace
    that %%px cells see."""
    import __main__

    import torch
    import torch.distributed as dist

    ns = __main__.__dict__
    from ddnb.collectives.devices import device_for

    device = device_for(names["backend"], names["local_rank"])
    ns.update(names, device=device, torch=torch, dist=dist)
    if horovod:
        import horovod.torch as hvd

        ns["hvd"] = hvd


def start_emulation(profile: dict, epoch: float) -> str:
    """Runs on an engine: make it one worker of the emulated cluster `profile`
    (`ddnb.emulate.activate`), and let each %%px cell start on a caught-up clock."""
    import torch.distributed as dist

    from ddnb import emulate

    name = emulate.activate(profile, dist.get_rank(), dist.get_world_size(), epoch)
    try:
        events = get_ipython().events  # noqa: F821  (an engine is an IPython kernel)
    except NameError:
        return name
    if emulate.resume not in events.callbacks["pre_execute"]:
        events.register("pre_execute", emulate.resume)
    return name


def resumed(fn):
    """fn, started on a caught-up emulated clock (`ddnb.emulate.resume`): the time a worker
    sat idle between tasks is neither work nor an overrun."""
    def call(*args, **kwargs):
        from ddnb.emulate import resume

        resume()
        return fn(*args, **kwargs)
    call.__name__ = getattr(fn, "__name__", "fn")
    return call
