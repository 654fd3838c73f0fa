"""This machine's measured costs (`ddnb.runtime.calibrate`), cached per host and boot:
read here, measured there (as its own program, since measuring starts processes). Used
by `ddnb.runtime.placement.default_slowdown`, the slowdown of the emulated clusters that
`notebooks/12_scalability.ipynb` teaches.
"""
from __future__ import annotations

import json
import os

FIELDS = ("flops", "bandwidth", "op_seconds", "message_seconds", "wake_late")


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def cache_key() -> str:
    """This host and boot, the torch build and the cores: any of them new measures again."""
    import torch

    boot = ""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        pass
    return f"{os.uname().nodename}/{boot}/torch {torch.__version__}/{cores()} cores"


def cache_path() -> str:
    root = os.environ.get("DDNB_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "ddnb")
    return os.path.join(root, "calibration.json")


def write_costs(costs: dict, path: str | None = None) -> None:
    """Write atomically (another process may be reading)."""
    path = path or cache_path()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(costs, f, indent=1)
    os.replace(tmp, path)


def read_costs(path: str | None = None) -> dict | None:
    """The costs measured on this host and boot, else None."""
    try:
        with open(path or cache_path()) as f:
            costs = json.load(f)
    except (OSError, ValueError):
        return None
    ok = (isinstance(costs, dict) and costs.get("key") == cache_key()
          and all(isinstance(costs.get(k), (int, float)) and costs[k] > 0 for k in FIELDS if k != "wake_late"))
    return costs if ok else None


def machine_costs(timeout: float = 120) -> dict | None:
    """This machine's costs: read, or measured by `python -m ddnb.runtime.calibrate` the first
    time on this boot (about 3 s). None, with a warning, if the measurement failed: the named
    profiles' slowdowns are then used as they are."""
    import subprocess
    import sys
    import warnings

    costs = read_costs()
    if costs is None:
        try:
            subprocess.run([sys.executable, "-m", "ddnb.runtime.calibrate", "--quiet"], check=True,
                           timeout=timeout, capture_output=True)
        except (subprocess.SubprocessError, OSError) as e:
            warnings.warn(f"ddnb could not measure this machine's costs ({e}); emulated clusters use the "
                          f"profiles' slowdowns scaled by workers per core", stacklevel=2)
            return None
        costs = read_costs()
    return costs
