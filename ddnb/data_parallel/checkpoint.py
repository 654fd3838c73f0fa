"""Checkpoints of a data-parallel run: everything needed for a run killed half-way to go
on as if it had never stopped.

What a step of data-parallel SGD depends on, and where it is kept:

    model parameters, buffers   the same on every rank    state.pt    (rank 0 writes it)
    optimizer state (momentum)  the same on every rank    state.pt
    step, the run's settings    the same on every rank    state.pt    (a resume with other settings is refused)
    sampler position            per rank: epoch, offset   rank-RRRRR.pt
    random generators           per rank: torch (CPU and  rank-RRRRR.pt (dropout, augmentation: each
                                CUDA), Python, NumPy                   rank draws its own numbers)
    the losses so far           per rank                  rank-RRRRR.pt

A checkpoint is a folder `step-SSSSSS` written in two phases, so that a crash at any
moment leaves either the complete new checkpoint or only the previous one:

    1. every rank writes its files into `step-SSSSSS.partial/`
    2. barrier: all files are on disk
    3. rank 0 renames the folder to `step-SSSSSS` (os.replace: atomic on POSIX file systems)
       and removes all but the newest `keep`

`latest_checkpoint` ignores `.partial` folders. The folder must be on a file system that
every rank sees (one machine, or NFS / Lustre on a cluster); this is the layout of
torch.distributed.checkpoint and torchtitan in miniature, without resharding: a resume
must have the same world size. Used by `ddnb.data_parallel.train.train_digits`; taught
in `notebooks/06_data_parallelism.ipynb`; tested in tests/test_checkpoint.py.
"""
from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path

from ddnb._checks import Checks

STEP_DIR = re.compile(r"^step-(\d{6,})$")


def rng_state() -> dict:
    """This process's random generators: torch CPU (and every CUDA device), Python, NumPy."""
    import numpy as np
    import torch

    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what `rng_state` returned."""
    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_rngs(seed: int) -> None:
    """Seed this process's torch, Python and NumPy generators (a rank passes its own seed)."""
    import numpy as np
    import torch

    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


def step_dir(directory, step: int) -> Path:
    return Path(directory) / f"step-{step:06d}"


def checkpoints(directory) -> list[tuple[int, Path]]:
    """The complete checkpoints in `directory`, oldest first: [(step, folder)]."""
    d = Path(directory)
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in d.iterdir() if p.is_dir() and (m := STEP_DIR.match(p.name))]
    return sorted(found)


def latest_checkpoint(directory) -> Path | None:
    """The newest complete checkpoint folder in `directory`, or None."""
    found = checkpoints(directory)
    return found[-1][1] if found else None


def save_checkpoint(directory, step: int, shared: dict, own: dict, rank: int, barrier, keep: int = 2) -> Path:
    """Write one checkpoint; call on every rank. `shared` is what all ranks hold alike (rank
    0 writes it: model, optimizer, step, settings), `own` this rank's (sampler position,
    random generators). `barrier()` waits for every rank. Returns the checkpoint folder."""
    import torch

    with Checks("save_checkpoint") as check:
        check.integer("step", step, min=0)
        check.integer("rank", rank, min=0)
        check.integer("keep", keep, min=1)
    final = step_dir(directory, step)
    partial = final.with_name(final.name + ".partial")
    partial.mkdir(parents=True, exist_ok=True)
    torch.save(own, partial / f"rank-{rank:05d}.pt")
    if rank == 0:
        torch.save(shared, partial / "state.pt")
    barrier()                                        # every rank's files are written
    if rank == 0:
        if final.exists():                           # a step-S of an earlier run in the same folder
            shutil.rmtree(final)
        os.replace(partial, final)
        for _, old in checkpoints(directory)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(folder, rank: int, world_size: int, settings: dict) -> tuple[dict, dict]:
    """Read a checkpoint on every rank: (shared, own). Refused, with every difference named,
    when it was written by another world size or with other settings (the same decision
    on every rank: they all read the same state.pt)."""
    import torch

    folder = Path(folder)
    shared = torch.load(folder / "state.pt", map_location="cpu", weights_only=False)
    wrong = {k: (shared["settings"].get(k), v) for k, v in settings.items() if shared["settings"].get(k) != v}
    if shared["world_size"] != world_size:
        wrong["world_size"] = (shared["world_size"], world_size)
    if wrong:
        said = ", ".join(f"{k}: checkpoint {a!r}, this run {b!r}" for k, (a, b) in sorted(wrong.items()))
        raise ValueError(f"cannot resume from {folder}: it was written by a different run ({said}); "
                         f"use the same settings, or another checkpoint folder, or resume=False to start over")
    own = torch.load(folder / f"rank-{rank:05d}.pt", map_location="cpu", weights_only=False)
    return shared, own
