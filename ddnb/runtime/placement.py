"""Where each rank runs and what it runs with: ranks assigned in order of (host, engine
id), local ranks counted per host, and the backend chosen from the GPUs each host has.
Engine ids are ipyparallel's bookkeeping and are not ranks. Used by `ddnb.runtime.cluster`;
taught in `notebooks/00_getting_started.ipynb`.
"""
from __future__ import annotations

from ddnb._checks import Checks
from ddnb.runtime.worker import GPU_BACKEND

MAX_LOCAL_WORKERS = 64
BACKENDS = ("auto", "gloo", "nccl")


def assign_ranks(engine_ids: list[int], infos: list[dict]) -> list[dict]:
    """One dict per rank, in rank order: rank, engine_id, local_rank and the engine's
    `worker.describe()` info. Ranks follow (order of first appearance of the host, engine
    id), so the ranks of one host are contiguous, as torchrun and horovodrun number them."""
    hosts_order = list(dict.fromkeys(i["host"] for i in infos))
    order = sorted(range(len(engine_ids)), key=lambda k: (hosts_order.index(infos[k]["host"]), engine_ids[k]))
    local: dict[str, int] = {}
    workers = []
    for rank, k in enumerate(order):
        host = infos[k]["host"]
        local[host] = local.get(host, -1) + 1
        workers.append(dict(rank=rank, engine_id=engine_ids[k], local_rank=local[host], **infos[k]))
    return workers


EMULATED_ON_GLOO = ("an emulated cluster runs on gloo over the host (its devices and links are modeled and "
                    "rank_device() is the CPU; CUDA tensors a rank makes itself still work, their messages "
                    "travelling through host memory): using gloo")


def choose_backend(backend: str, hosts: list[str], gpus: list[int], emulated: bool = False) -> tuple[str, str | None]:
    """"auto": GPU_BACKEND ("cpu:gloo,cuda:nccl": CPU tensors over gloo, CUDA
    tensors over nccl) when every worker can have a GPU of its own on its host, else gloo.
    "nccl": pure nccl (what was asked for; CPU tensors then fail), or ValueError without
    a GPU per worker. `emulated`: gloo whatever the GPUs, said when it is not what a
    GPU host would give (the emulator's clocks pace host work; a GPU's asynchronous
    kernels would run outside them). Returns (backend, message) where message explains a
    fallback."""
    if backend == "gloo":
        return "gloo", None
    if emulated:
        return "gloo", (EMULATED_ON_GLOO if backend == "nccl" or any(gpus) else None)
    per_host = {h: hosts.count(h) for h in hosts}
    gpus_on = dict(zip(hosts, gpus))
    short = {h: (n, gpus_on[h]) for h, n in per_host.items() if gpus_on[h] < n}
    if not short:
        return ("nccl" if backend == "nccl" else GPU_BACKEND), None
    why = ", ".join(f"{h}: {n} workers but {g} GPU{'s' if g != 1 else ''}" for h, (n, g) in short.items())
    if backend == "nccl":
        raise ValueError(f"backend='nccl' needs one GPU per worker ({why}); use backend='gloo' or fewer workers")
    if any(gpus):
        return "gloo", f"fewer GPUs than workers ({why}): using gloo on CPU"
    return "gloo", None


def check_n(n, allow_none: bool = False, check: Checks | None = None) -> None:
    """n, a number of local workers: an integer from 1 to MAX_LOCAL_WORKERS (None: every
    engine of a connected ipcluster, with allow_none). Adds to `check`, else raises."""
    c = check or Checks()
    if not (n is None and allow_none):
        c.integer("n", n, min=1, max=MAX_LOCAL_WORKERS,
                  why=" workers (for more, connect to an ipcluster with profile=/cluster_id=)")
    if check is None:
        c.done()


def emulated_profile(emulate, check: Checks, workers: int | None = None):
    """The emulated cluster's Profile (None: real mode); a bad one is a problem in `check`.
    A profile given by name gets `default_slowdown` for `workers` on this machine; a
    Profile object is used as given (its slowdown is the caller's choice)."""
    if emulate is None:
        return None
    from ddnb.emulate import get_profile

    try:
        profile = get_profile(emulate)
    except ValueError as e:
        check.rule(False, str(e))
        return None
    if isinstance(emulate, str) and isinstance(workers, int) and workers >= 1:
        profile = profile.with_(slowdown=default_slowdown(profile, workers))
    return profile


def scaled_slowdown(slowdown: float, workers: int, cores: int | None = None) -> float:
    """A named profile's slowdown is set for one worker per core; with more workers than
    cores each gets 1/(workers/cores) of a core, so its real work takes that much longer
    and the dilation grows by the same factor: slowdown x max(1, workers / cores)."""
    from ddnb.runtime.machine import cores as machine_cores

    return slowdown * max(1.0, workers / (cores or machine_cores()))


# How much room the calibrated slowdown leaves above the measured ratios of real to
# emulated cost (real work varies by tens of percent from call to call).
CALIBRATION_MARGIN = 1.5


SLOWDOWN_STEPS = (1, 1.5, 2, 3, 4, 5, 6, 8, 10)   # per decade: each at most 1.5x the one before


def needed_slowdown(profile, costs: dict, workers: int, cores: int | None = None) -> float:
    """The slowdown at which this machine keeps pace with `profile`: the largest ratio of real
    to emulated cost of the work the emulator charges, compute (the profile's FLOP/s x MFU
    against this core's matmul FLOP/s; its memory bandwidth against this core's) and
    messages (a message's real cost in ddnb's message layer against the smallest alpha),
    times the workers sharing each core, times CALIBRATION_MARGIN."""
    ratios = (profile.peak_flops * profile.efficiency / costs["flops"],
              profile.memory_bandwidth / costs["bandwidth"],
              costs["message_seconds"] / min(profile.intra.alpha, profile.inter.alpha))
    return CALIBRATION_MARGIN * scaled_slowdown(max(ratios), workers, cores)


def default_slowdown(profile, workers: int, costs: dict | None = None, cores: int | None = None) -> float:
    """The default slowdown of a named profile for `workers` ranks on this machine: the
    larger of the profile's own (set for one worker per core, scaled by workers per core:
    the stored notebooks were checked at it) and what this machine measurably needs
    (`needed_slowdown`, from `ddnb.runtime.machine.machine_costs()`), rounded up to 1, 1.5, 2,
    3, 4, 5, 6 or 8 times a power of ten (steps of at most 1.5x: a coarser 1-2-5 rounding
    nearly doubled the real time of every emulated run on a machine needing 5,840x)."""
    import math

    from ddnb.runtime.machine import machine_costs

    floor = scaled_slowdown(profile.slowdown, workers, cores)
    costs = machine_costs() if costs is None else costs
    if not costs:
        return floor
    need = needed_slowdown(profile, costs, workers, cores)
    if need <= floor:
        return floor
    decade = 10.0 ** math.floor(math.log10(need))
    return next(m * decade for m in SLOWDOWN_STEPS if m * decade >= need)
