"""Horovod's tensor-fusion knobs, and what each rank runs to re-measure them on the engines
of a `ddnb.Cluster` (the harness that re-forms Horovod there: `ddnb.bench.horovod_knobs`).

Two settings decide how `hvd.DistributedOptimizer`'s gradients travel (Sergeev & Del Balso
2018, Sec. 6, "Tensor Fusion"): every **cycle** (HOROVOD_CYCLE_TIME, ms) Horovod's
background thread takes the gradients ready on every rank and packs them into one
**fusion buffer** of at most HOROVOD_FUSION_THRESHOLD bytes, all-reduced at once;
threshold 0 switches fusion off (one all-reduce per tensor, each paying the latency α of
chapter 05). A third, fp16 compression (`hvd.Compression.fp16`), halves the bytes on the
wire and is an argument of DistributedOptimizer, not a setting of the process.

Horovod 0.28.1 reads the first two only at hvd.init(), and cannot start again in the same
process with other values: here an hvd.shutdown(), a changed HOROVOD_FUSION_THRESHOLD /
HOROVOD_CYCLE_TIME and a second hvd.init() killed both ranks of a 2-rank cluster on the
second such restart (the first one survived; `ddnb.runtime.horovod.check_settings` refuses
it for that reason). So `ddnb.bench.horovod_knobs.measure_knobs` restarts the cluster's
engines (fresh processes, a few seconds) whenever the settings change, then starts Horovod
with them (`Cluster.start_horovod(env=...)`); changing only fp16 reuses the running Horovod.

    run = measure_knobs(cluster, fusion_mb=0)                 # ddnb.bench.horovod_knobs: restarts if needed
    run["allreduces_per_step"], run["step_time"]              # 34 (one per tensor), seconds

`knob_steps` (on every rank) times a few training steps of a deep, narrow MLP (34
gradient tensors) and records Horovod's timeline for a few more; `fused_allreduces`
reads the timeline: the tensors of one fused all-reduce share its start. Taught in
`notebooks/07_horovod.ipynb` (the widget is `ddnb.viz.widgets.horovod_knobs.HorovodKnobs`).
"""
from __future__ import annotations

import time

from ddnb._checks import Checks

ALLREDUCE_ACTIVITIES = ("GLOO_ALLREDUCE", "NCCL_ALLREDUCE", "MPI_ALLREDUCE")


DEFAULTS = {"fusion_mb": 128, "cycle_ms": 1}   # Horovod 0.28.1's own (`horovodrun --help`)


def knob_env(fusion_mb: float | None = None, cycle_ms: float | None = None) -> dict:
    """The HOROVOD_* settings for a fusion threshold in MB (2**20 bytes) and a cycle in ms;
    None leaves a knob at Horovod's default (`DEFAULTS`), i.e. out of the environment."""
    with Checks("knob_env") as check:
        check.number("fusion_mb", fusion_mb, min=0, none=True, why=" (MB; 0 switches fusion off)")
        check.number("cycle_ms", cycle_ms, positive=True, none=True, why=" (ms)")
    env = {}
    if fusion_mb is not None:
        env["HOROVOD_FUSION_THRESHOLD"] = str(int(fusion_mb * 2**20))
    if cycle_ms is not None:
        env["HOROVOD_CYCLE_TIME"] = f"{cycle_ms:g}"
    return env


def fused_allreduces(events: list[dict]) -> list[int]:
    """Tensors per fused all-reduce, in time order, from `horovod_timeline_events`. The
    all-reduce activity (GLOO_ALLREDUCE on CPUs, NCCL_ALLREDUCE on GPUs) of every tensor of
    one fusion buffer starts before the collective runs and ends after it, so their spans
    overlap; the background thread runs one collective at a time, so those of different
    buffers do not. (Grouping by overlap rather than by equal start times: the timeline
    stamps each tensor's start as it writes it, so one buffer's starts may differ.)"""
    spans = sorted((e["start"], e["end"]) for e in events if e["activity"] in ALLREDUCE_ACTIVITIES)
    groups: list[int] = []
    first_end = None
    for start, end in spans:
        if first_end is None or start >= first_end:            # the previous buffer is done: a new one
            groups.append(0)
            first_end = end
        groups[-1] += 1
        first_end = min(first_end, end)
    return groups


def knob_steps(path: str, steps: int = 10, traced: int = 3, layers: int = 16, hidden: int = 64,
               fp16: bool = False) -> dict:
    """On every rank (Horovod initialized): train an MLP of `layers` hidden layers of
    `hidden` units on 32 digits per rank with hvd.DistributedOptimizer; time `steps` steps
    (after one warm-up) and record the timeline of `traced` more into `path` (rank 0).
    Returns {"step_time": median seconds, "tensors": gradient tensors, "fused": tensors per
    fused all-reduce (rank 0; [] elsewhere), "traced": traced}."""
    import statistics

    import horovod.torch as hvd
    import torch
    import torch.nn.functional as F

    from ddnb.data import digits
    from ddnb.data_parallel.horovod import horovod_optimizer, horovod_timeline, horovod_timeline_events
    from ddnb.models import mlp

    train_set, _ = digits(seed=0)
    model = mlp((64,) + (hidden,) * layers + (10,), seed=0)
    compression = hvd.Compression.fp16 if fp16 else hvd.Compression.none
    opt = horovod_optimizer(model, torch.optim.SGD(model.parameters(), lr=0.01), compression=compression)
    lo = 32 * hvd.rank()
    x, y = train_set.x[lo:lo + 32], train_set.y[lo:lo + 32]        # (32, 64), (32,)

    def step():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    step()                                                          # warm-up: Horovod's response cache fills
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    with horovod_timeline(path):
        for _ in range(traced):
            step()
    fused = []
    if hvd.rank() == 0:
        for _ in range(50):                                         # the writer thread may lag the stop
            fused = fused_allreduces(horovod_timeline_events(path))
            if sum(fused) >= traced * 2 * (layers + 1):
                break
            time.sleep(0.02)
    return {"step_time": statistics.median(times), "tensors": 2 * (layers + 1), "fused": fused, "traced": traced}
