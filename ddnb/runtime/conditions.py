"""The conditions a measurement comes from, and whether the machine is quiet enough to make
one worth storing.

Every number a notebook measures (a step time, a bandwidth, a speedup) depends on the
machine: how many cores, what else runs on them, whether the cluster is real or emulated.
`conditions()` gathers those facts once, at the top of a notebook, so that every stored
figure can be read against them; `busy_reasons()` is what `make notebooks`
(`scripts/run_notebooks.py`) checks before it runs a notebook and stores its outputs.

    from ddnb.runtime.conditions import conditions
    print(conditions())   # 2 cores (Intel(R) Xeon(R) Processor), torch 2.13.0, real processes ...

"Quiet" here means: the load average over the last minute is at most the number of cores,
and no other ddnb cluster (ipyparallel engines or controller, torchrun, horovodrun, a
`ddnb.testing` world) is alive outside the calling process's own tree. Taught in
`notebooks/00_getting_started.ipynb` and stated at the top of every notebook.
"""
from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass

from ddnb.runtime.worker import available_cores

# Command-line fragments of processes that run a ddnb cluster's workers (or drive one).
CLUSTER_MARKERS = ("ipyparallel.engine", "ipyparallel.controller", "ipengine", "ipcontroller",
                   "torch.distributed.run", "torchrun", "horovodrun", "ddnb.testing", "ddnb.launch")


def cores() -> int:
    """The CPU cores this process may run on (`ddnb.runtime.worker.available_cores`)."""
    return available_cores()


def cpu_model() -> str:
    """The CPU's model name, from /proc/cpuinfo on Linux, else what `platform` says."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _own_tree() -> set[int]:
    import psutil

    me = psutil.Process()
    own = {me.pid} | {c.pid for c in me.children(recursive=True)}
    parent = me.parent()
    while parent is not None:   # the notebook kernel's launcher, pytest, make: not "others"
        own.add(parent.pid)
        parent = parent.parent()
    return own


def other_clusters() -> list[str]:
    """'pid P: command' for every process outside this process's own tree (its children
    and its ancestors) whose command line marks it as part of a ddnb cluster."""
    import psutil

    own, found = _own_tree(), []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if p.info["pid"] not in own and any(m in cmd for m in CLUSTER_MARKERS):
            found.append(f"pid {p.info['pid']}: {cmd[:100]}")
    return found


def others_cpu(seconds: float = 0.5) -> float:
    """CPU used by processes outside this process's own tree over `seconds`, in cores
    (1.0 = one core fully busy)."""
    import psutil

    own = _own_tree()
    procs = [p for p in psutil.process_iter() if p.pid not in own]
    before = {}
    for p in procs:
        try:
            before[p] = p.cpu_times()
        except psutil.Error:
            pass
    time.sleep(seconds)
    used = 0.0
    for p, t0 in before.items():
        try:
            t1 = p.cpu_times()
        except psutil.Error:
            continue
        used += (t1.user + t1.system) - (t0.user + t0.system)
    return used / seconds


@dataclass
class Conditions:
    """What a notebook's measurements were made under. `emulate` is the emulated cluster's
    profile name, None for real processes timed by the wall clock."""
    cores: int
    cpu: str
    load: float
    others: float
    torch: str
    emulate: str | None = None

    @property
    def quiet(self) -> bool:
        return self.load <= self.cores

    def __str__(self) -> str:
        mode = (f"emulated cluster, profile {self.emulate!r} (times are the profile's, not this machine's)"
                if self.emulate else "real processes, wall-clock times of this machine")
        return (f"{self.cores} cores ({self.cpu}), torch {self.torch}; {mode}; at the start: load average "
                f"{self.load:.1f}, other processes using {self.others:.2f} cores "
                f"({'quiet' if self.quiet else 'BUSY: load above the core count, timings are not representative'})")


def conditions(emulate: str | None = None) -> Conditions:
    """The machine's conditions now: cores, CPU, load average, other processes' CPU use."""
    try:
        import torch

        version = torch.__version__
    except ImportError:
        version = "not installed"
    return Conditions(cores=cores(), cpu=cpu_model(), load=os.getloadavg()[0], others=others_cpu(),
                      torch=version, emulate=emulate)


def busy_reasons(max_load: float | None = None) -> list[str]:
    """Why this machine is not quiet enough to store measurements: the load average above
    `max_load` (default: the core count), and every other ddnb cluster alive. Empty when
    quiet."""
    limit = cores() if max_load is None else max_load
    load = os.getloadavg()[0]
    reasons = [f"load average {load:.1f} over the last minute is above {limit:g}"] if load > limit else []
    others = other_clusters()
    if others:
        more = f"; and {len(others) - 3} more" if len(others) > 3 else ""
        reasons.append(f"{len(others)} processes of other ddnb clusters are running ({'; '.join(others[:3])}{more})")
    return reasons
