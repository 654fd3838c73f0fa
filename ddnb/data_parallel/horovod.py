"""The same data-parallel training with Horovod (Sergeev & Del Balso, "Horovod: fast and
easy distributed deep learning in TensorFlow", 2018), and its timeline.

Horovod reaches what `bucketed.py` does by another route: `hvd.DistributedOptimizer`
registers a hook per parameter that hands its gradient to Horovod as soon as it is
ready; a background thread, every cycle (HOROVOD_CYCLE_TIME, ms), has the ranks agree on
which tensors are ready everywhere (negotiation; the coordinator is rank 0), packs them
into one fusion buffer (HOROVOD_FUSION_THRESHOLD, 64 MB: "Tensor Fusion", Sec. 6 of the
paper) and all-reduces it, over Gloo on CPUs and NCCL on GPUs;
`optimizer.step()` waits for the averages. Horovod must be initialized first (by the
caller: `ddnb.Cluster(horovod=True)` or `ddnb.testing.World(n, horovod=True)`).

    optimizer = horovod_optimizer(model, torch.optim.SGD(model.parameters(), lr=0.1))
    loss_fn(model(x), y).backward()
    optimizer.step()                      # waits for the all-reduces, then steps

The timeline (Sec. 5 of the paper): Horovod's rank 0 (the coordinator) writes every
tensor's life (negotiate, wait for data, memcpy into the fusion buffer, all-reduce, memcpy
out) in the Chrome trace format. `hvd.start_timeline(path)` needs HOROVOD_TIMELINE=DYNAMIC in the environment
*before* `hvd.init()` (Horovod 0.28 reads it only at init); `horovod_timeline(path)` wraps
start/stop, and `horovod_timeline_events(path)` turns the file into ddnb.trace events for
`ddnb.viz.gradients.plot_horovod_timeline` (one row per tensor) or
`ddnb.viz.plot_timeline`. Taught in `notebooks/07_horovod.ipynb`.
"""
from __future__ import annotations

import contextlib
import json
import os

# Horovod's activity names -> ddnb.trace kinds
KIND_OF_ACTIVITY = {"NEGOTIATE": "wait", "QUEUE": "wait", "WAIT_FOR_DATA": "wait", "WAIT_FOR_OTHER_TENSOR_DATA": "wait",
                    "MEMCPY_IN_FUSION_BUFFER": "other", "MEMCPY_OUT_FUSION_BUFFER": "other",
                    "INIT_FUSION_BUFFER": "other", "MEMCPY_IN_HOST_BUFFER": "other", "MEMCPY_OUT_HOST_BUFFER": "other"}


def horovod_optimizer(model, optimizer, root_rank: int = 0, **kwargs):
    """Broadcast `model`'s parameters and buffers and `optimizer`'s state from `root_rank`,
    and wrap the optimizer in hvd.DistributedOptimizer (averaging over ranks, as DDP);
    kwargs go to DistributedOptimizer (compression, backward_passes_per_step, op, ...)."""
    import horovod.torch as hvd

    if not hvd.is_initialized():
        raise ValueError("horovod_optimizer: Horovod is not initialized; start the cluster with horovod=True "
                         "(ddnb.Cluster(horovod=True) or ddnb.testing.World(n, horovod=True))")
    hvd.broadcast_parameters(model.state_dict(), root_rank=root_rank)
    hvd.broadcast_optimizer_state(optimizer, root_rank=root_rank)
    return hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), **kwargs)


@contextlib.contextmanager
def horovod_timeline(path: str, mark_cycles: bool = False):
    """Record Horovod's timeline into `path` while the block runs (call on every rank;
    rank 0 writes the file). Needs HOROVOD_TIMELINE=DYNAMIC set before hvd.init()."""
    import horovod.torch as hvd

    if os.environ.get("HOROVOD_TIMELINE") != "DYNAMIC":
        raise ValueError(f"horovod_timeline: HOROVOD_TIMELINE={os.environ.get('HOROVOD_TIMELINE')!r} in this process; "
                         f"it must be 'DYNAMIC' before hvd.init() (Horovod reads it only at init) for "
                         f"hvd.start_timeline to work")
    hvd.start_timeline(path, mark_cycles=mark_cycles)
    try:
        yield path
    finally:
        hvd.stop_timeline()


def read_chrome_trace(path: str) -> list[dict]:
    """The event list of a Chrome-trace JSON file, also when it is still being written
    (Horovod's file has no closing bracket until the timeline stops)."""
    with open(path) as f:
        text = f.read().strip()
    if text.startswith("{"):
        return json.loads(text)["traceEvents"]
    text = text.rstrip(",")
    if not text.endswith("]"):
        text += "]"
    return json.loads(text)


def horovod_timeline_events(path: str, rank: int = 0) -> list[dict]:
    """Horovod's timeline file as ddnb.trace event dicts, one per activity (a matched
    "B"/"E" pair or an "X" event), sorted by start: rank (`rank`, the one that wrote the
    file), kind ("collective" for the all-reduce itself, "wait" for negotiation and
    queueing, "other" for fusion-buffer copies), name ("<tensor>: <ACTIVITY>"), start and
    end in time.time() seconds (from the file's start_time_since_epoch_in_micros),
    nbytes 0, and tensor, row (the tensor's row in Horovod's view), activity, depth
    (0 = an operation, 1 = a phase inside it) and leaf (no phase inside it)."""
    raw = read_chrome_trace(path)
    t0_us, tensors = 0, {}
    for e in raw:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            args = e.get("args", {})
            if "start_time_since_epoch_in_micros" in args:
                t0_us = args["start_time_since_epoch_in_micros"]
            if "name" in args:
                tensors[e["pid"]] = args["name"]
    open_spans: dict = {}
    out = []

    def add(pid, name, start, end, depth, args):
        activity = name or "?"
        kind = KIND_OF_ACTIVITY.get(activity, "wait" if activity.startswith("NEGOTIATE") else "collective")
        tensor = tensors.get(pid, f"tensor {pid}")
        out.append({"rank": rank, "kind": kind, "name": f"{tensor}: {activity}",
                    "start": (t0_us + start) * 1e-6, "end": (t0_us + end) * 1e-6, "peer": None, "nbytes": 0,
                    "tensor": tensor, "row": pid, "activity": activity, "depth": depth, "leaf": True,
                    **({"args": args} if args else {})})
        return out[-1]

    for e in sorted((e for e in raw if e.get("ph") in ("B", "E", "X")), key=lambda e: e["ts"]):
        stack = open_spans.setdefault(e["pid"], [])
        if e["ph"] == "B":
            if stack:
                stack[-1]["has_child"] = True
            stack.append({"name": e.get("name"), "ts": e["ts"], "has_child": False})
        elif e["ph"] == "E" and stack:    # an "E" without its "B" began before the timeline: dropped
            b = stack.pop()
            ev = add(e["pid"], b["name"], b["ts"], e["ts"], len(stack), e.get("args"))
            ev["leaf"] = not b["has_child"]
        elif e["ph"] == "X" and e.get("dur", 0) > 0:   # zero-length "X": a rank's ready mark
            add(e["pid"], e.get("name"), e["ts"], e["ts"] + e["dur"], len(stack), e.get("args"))
    return sorted(out, key=lambda ev: (ev["start"], ev["row"]))
