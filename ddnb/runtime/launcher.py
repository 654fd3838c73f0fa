"""What a process started by a launcher (torchrun, horovodrun, mpirun) reads from its
environment: which launcher started it, how many ranks share its host (and so its cores),
and the backend its ranks can form. Used by `ddnb.launch` (`python -m ddnb.launch`) and by
the elastic workers it starts (`ddnb/elastic/torchrun_train.py`, `horovod_train.py`).
Taught in `notebooks/07_horovod.ipynb`.
"""
from __future__ import annotations

import os

from ddnb.runtime.worker import limit_threads


def launcher_env(environ=os.environ) -> str:
    """"horovodrun", "torchrun" (or any env:// launcher) or "none", from the environment."""
    if "HOROVOD_RANK" in environ:
        return "horovodrun"
    if all(k in environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
        return "torchrun"
    return "none"


LOCAL_SIZE_VARS = ("LOCAL_WORLD_SIZE", "HOROVOD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE")


def local_ranks(environ=os.environ) -> int:
    """The ranks the launcher started on this host: torchrun's LOCAL_WORLD_SIZE,
    horovodrun's HOROVOD_LOCAL_SIZE (Gloo) or Open MPI's OMPI_COMM_WORLD_LOCAL_SIZE
    (horovodrun over mpirun); 1 when none is set. Each rank gets cores / this many
    intra-op threads (`ddnb.runtime.worker.threads_for`; $DDNB_THREADS overrides)."""
    for var in LOCAL_SIZE_VARS:
        if environ.get(var, "").strip().isdigit() and int(environ[var]) >= 1:
            return int(environ[var])
    return 1


def set_threads() -> int:
    """Give this rank cores / local_ranks() intra-op threads, at least 1 ($DDNB_THREADS
    overrides; `ddnb.runtime.worker.limit_threads`); returns the count. torchrun sets
    OMP_NUM_THREADS=1 and horovodrun sets nothing: under horovodrun -np 2 on 2 cores each
    rank used both cores and fought Horovod's background thread for them, 95 ms a step
    instead of 2.2 ms."""
    return limit_threads(local_ranks())


def launcher_backend(gpus: int, local_size: int) -> str:
    """"cpu:gloo,cuda:nccl" (gloo for CPU tensors, nccl for CUDA ones) when each of the
    `local_size` ranks on this node can have one of its `gpus` GPUs (cuda:LOCAL_RANK,
    `ddnb.runtime.worker.rank_device()`), else "gloo"."""
    from ddnb.runtime.worker import GPU_BACKEND

    return GPU_BACKEND if 0 < local_size <= gpus else "gloo"
