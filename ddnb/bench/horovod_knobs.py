"""Horovod's tensor-fusion knobs measured on a `ddnb.Cluster`: `measure_knobs` re-forms
Horovod on the cluster's engines with the settings asked for (restarting the engines when
Horovod already ran there with other ones: `ddnb.data_parallel.horovod_knobs` says why)
and runs `ddnb.data_parallel.horovod_knobs.knob_steps` on every rank.

    run = measure_knobs(cluster, fusion_mb=0)                 # restarts if needed, then trains
    run["allreduces_per_step"], run["step_time"]              # 34 (one per tensor), seconds

Taught in `notebooks/07_horovod.ipynb` (the widget is `ddnb.viz.widgets.horovod_knobs.HorovodKnobs`).
"""
from __future__ import annotations

import os
import tempfile
import time

from ddnb._checks import Checks
from ddnb.data_parallel.horovod_knobs import knob_env, knob_steps


def measure_knobs(cluster, fusion_mb: float | None = None, cycle_ms: float | None = None, fp16: bool = False,
                  steps: int = 10, traced: int = 3) -> dict:
    """Train a few steps with Horovod on `cluster`'s engines under these knobs (None:
    Horovod's default), restarting the engines first when Horovod ran there with other
    settings (`ddnb.data_parallel.horovod_knobs` says why; a restart also clears what the
    notebook left in the engines' namespace). With engines started elsewhere
    (`Cluster(profile=...)`) a restart reconnects to the same processes, so only the
    settings Horovod first started with there can be measured: other ones raise
    start_horovod's ValueError. Returns the knobs, "step_time" (s, slowest rank's median),
    "tensors", "fused" (tensors per fused all-reduce over the traced steps), "allreduces_per_step",
    "tensors_per_allreduce" and "restart_s" (seconds spent restarting, 0 if none)."""
    from ddnb.runtime.horovod import horovod_available

    env = knob_env(fusion_mb, cycle_ms)
    with Checks("measure_knobs") as check:
        check.integer("steps", steps, min=1)
        check.integer("traced", traced, min=1)
        check.rule(horovod_available(), "Horovod with PyTorch is not installed (run `make lab`)")
        check.rule(getattr(cluster, "emulate", None) is None, "Horovod is not emulated: use a real-mode cluster")
    t0 = time.monotonic()
    restarted = _start_with(cluster, env)
    restart_s = time.monotonic() - t0 if restarted else 0.0
    path = os.path.join(tempfile.mkdtemp(prefix="ddnb-knobs-"), "timeline.json")
    out = cluster.run(knob_steps, path, steps, traced, fp16=fp16)
    fused = out[0]["fused"]
    return {"fusion_mb": fusion_mb, "cycle_ms": cycle_ms, "fp16": fp16, "workers": cluster.n,
            "step_time": max(o["step_time"] for o in out), "tensors": out[0]["tensors"], "fused": fused,
            "allreduces_per_step": len(fused) / traced,
            "tensors_per_allreduce": sum(fused) / max(1, len(fused)), "restart_s": restart_s}


def _start_with(cluster, env: dict) -> bool:
    """Horovod running on `cluster` with exactly `env`; True if the engines were restarted."""
    if cluster.horovod and getattr(cluster, "_horovod_env", None) == env:   # the settings it started with
        return False
    cluster.stop_horovod()
    try:
        cluster.start_horovod(env=env)
        return False
    except ValueError as e:
        if "already ran" not in str(e):
            raise
    cluster.restart()                     # fresh engine processes: Horovod may start once more
    cluster.start_horovod(env=env)
    return True
