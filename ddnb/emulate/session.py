"""Starting and stopping one worker's emulation: the clock installed (`ddnb.emulate.clock`),
the message layer plugged into `ddnb.collectives.p2p` as its transport
(`ddnb.emulate.messages.post`), compute paced (`ddnb.emulate.compute`), and the one-time
costs of a process's first messages and first training step paid before the clock starts.
Runs on every rank (`ddnb.Cluster(emulate=...)` and `ddnb.testing.World(emulate=...)` call
it). Taught in `notebooks/05_allreduce.ipynb`.
"""
from __future__ import annotations

import gc
import importlib

from ddnb.emulate import clock, messages
from ddnb.emulate.profile import get_profile


def activate(profile, rank: int, world_size: int, epoch: float, pace_compute: bool = True) -> str:
    """Runs on every rank: from now on this process is one worker of the emulated cluster
    `profile` (messages through `ddnb.collectives.p2p` are paced, and with pace_compute
    every torch operation of this thread is charged its modeled time). `epoch`: a
    time.monotonic() value shared by all ranks (one machine, one clock)."""
    deactivate()
    importlib.import_module("ddnb.collectives")   # first imports are not a worker's work: before the clock starts
    from ddnb.collectives import p2p, traced

    profile = get_profile(profile)
    emulator = clock.Emulator(profile, rank, world_size, epoch)
    clock.install(emulator)
    p2p.set_transport(messages.post)       # every message from now on: real bytes, plus the header
    traced.set_emulated({"all_reduce": messages.all_reduce, "all_gather": messages.all_gather,
                         "barrier": messages.barrier, "all_reduce_async": messages.EmulatedAllReduce,
                         "ddp_comm_hook": messages.ddp_comm_hook, "broadcast": messages.broadcast,
                         "all_to_all": messages.all_to_all, "reduce_scatter": messages.reduce_scatter})   # torch's own collectives: timed by the ring's messages
    if pace_compute:
        from ddnb.emulate.compute import start_pacing

        start_pacing(emulator)
    _warm_up(rank, world_size)
    emulator.shared()      # after the warm-up's barrier every rank has opened the host NICs' state
    # A full garbage collection scans every object the process holds (~170,000 once torch is
    # imported): ~50 ms of real time at a moment no model knows. Objects alive now are
    # frozen out of later collections (gc.freeze), which then scan only what the run allocates.
    gc.collect()
    gc.freeze()
    emulator.reset()   # the warm-up's time and counts are not the run's
    return profile.name


def _warm_up(rank: int, world_size: int) -> None:
    """A barrier and one ring step on every rank: the first collective and the first
    messages of a process pay one-time set-up (seconds on a busy machine), which is not
    the cluster's time."""
    import torch

    from ddnb.collectives import p2p
    from ddnb.trace import Tracer

    messages.barrier()
    if world_size > 1:
        x, y = torch.zeros(1), torch.zeros(1)
        p2p.exchange(x, (rank + 1) % world_size, y, (rank - 1) % world_size, tracer=Tracer(enabled=False))
    layer = torch.nn.Linear(2, 2)          # a training step's first use of autograd, a loss and an optimizer
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.0)   # (lazy imports: torch.optim loads torch._dynamo)
    torch.nn.functional.mse_loss(layer(torch.zeros(1, 2)), torch.zeros(1, 2)).backward()
    optimizer.step()
    messages.barrier()


def deactivate() -> dict | None:
    """Back to real mode; returns the last report (None if not emulating)."""
    emulator = clock.current()
    if emulator is None:
        return None
    from ddnb.collectives import p2p, traced
    from ddnb.emulate.compute import stop_pacing

    stop_pacing()
    p2p.set_transport(None)
    traced.set_emulated(None)
    clock.install(None)
    emulator.close()
    return emulator.report()
