"""A per-rank event recorder: what each rank computed and sent, when, to whom, how much.

Every ddnb collective, parameter server and parallel layer records into a `Tracer`; the
notebook gathers the events from the ranks and draws them (`ddnb.viz.timeline`) or exports
them to the Chrome trace format (Perfetto, chrome://tracing), like Horovod's timeline
and the PyTorch profiler do.

    tracer = Tracer(rank=0)
    with tracer.span("compute", "forward"):
        y = model(x)
    tracer.record("send", "grad", start, end, peer=1, nbytes=4096)
    events = tracer.take()           # plain dicts, picklable, cleared from the tracer

Cheap enough to leave on: one small dict per event, appended to a bounded deque.
Each process has one default tracer (`get_tracer()`), used when none is passed in.
Times are `time.time()` seconds, comparable across the processes of one machine; in an
emulated cluster (`ddnb.emulate`) spans are stamped in the worker's emulated time, as its
messages are (`now`).
Taught in `notebooks/03_collectives.ipynb` and `notebooks/05_allreduce.ipynb`.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections import deque

def now() -> float:
    """The time a span starts or ends: `ddnb.emulate.stamp()` once this process has loaded
    the emulator (time.time() in real mode, its emulated time when emulating)."""
    clock = sys.modules.get("ddnb.emulate.clock")
    return time.time() if clock is None else clock.stamp()


KINDS = ("compute", "send", "recv", "collective", "wait", "other")
MAX_EVENTS = 200_000


class Tracer:
    """Records events of one rank. `enabled=False` makes every call a no-op."""

    def __init__(self, rank: int | None = None, enabled: bool = True, max_events: int = MAX_EVENTS):
        self.rank = rank
        self.enabled = enabled
        self.events: deque = deque(maxlen=max_events)

    def _rank(self) -> int:
        if self.rank is not None:
            return self.rank
        import torch.distributed as dist

        return dist.get_rank() if dist.is_available() and dist.is_initialized() else int(os.environ.get("RANK", 0))

    def record(self, kind: str, name: str, start: float, end: float, peer: int | None = None,
               nbytes: int = 0, **extra) -> None:
        """Add one event; `peer` is the other rank of a send/recv, `nbytes` its payload."""
        if not self.enabled:
            return
        if kind not in KINDS:
            raise ValueError(f"kind={kind!r} is not one of {KINDS}")
        ev = {"rank": self._rank(), "kind": kind, "name": name, "start": start, "end": end,
              "peer": peer, "nbytes": int(nbytes)}
        if extra:
            ev.update(extra)
        self.events.append(ev)

    @contextlib.contextmanager
    def span(self, kind: str, name: str = "", peer: int | None = None, nbytes: int = 0, **extra):
        """Record the time spent inside the `with` block as one event."""
        if not self.enabled:
            yield
            return
        start = now()
        try:
            yield
        finally:
            self.record(kind, name, start, now(), peer=peer, nbytes=nbytes, **extra)

    def take(self) -> list[dict]:
        """Return the recorded events and clear them."""
        out = list(self.events)
        self.events.clear()
        return out

    def clear(self) -> None:
        self.events.clear()


_default = Tracer()


def get_tracer(tracer: Tracer | None = None) -> Tracer:
    """`tracer` if given, else this process's default tracer."""
    return _default if tracer is None else tracer


def take_events() -> list[dict]:
    """The default tracer's events, cleared (call on every rank, e.g. `cluster.run(take_events)`)."""
    return _default.take()


def flatten(per_rank: list[list[dict]]) -> list[dict]:
    """Merge the event lists that `cluster.run(take_events)` returns, sorted by start time."""
    return sorted((e for evs in per_rank for e in evs), key=lambda e: (e["start"], e["rank"]))


def bytes_sent(events: list[dict], world_size: int | None = None) -> list[int]:
    """Bytes each rank sent, from its "send" events (index = rank)."""
    n = world_size if world_size is not None else 1 + max((e["rank"] for e in events), default=-1)
    out = [0] * n
    for e in events:
        if e["kind"] == "send":
            out[e["rank"]] += e["nbytes"]
    return out


def to_chrome_trace(events: list[dict], path: str | None = None) -> dict:
    """The events in the Chrome trace event format: one process row per rank, one thread
    per kind, "X" (complete) events in microseconds, and a flow arrow from each send to the
    matching receive. Open the file in https://ui.perfetto.dev or chrome://tracing."""
    t0 = min((e["start"] for e in events), default=0.0)
    tids = {k: i for i, k in enumerate(KINDS)}
    out = []
    for rank in sorted({e["rank"] for e in events}):
        out.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": rank, "args": {"sort_index": rank}})
    for e in events:
        args = {k: v for k, v in e.items() if k not in ("rank", "kind", "name", "start", "end")}
        out.append({"ph": "X", "name": e["name"] or e["kind"], "cat": e["kind"], "pid": e["rank"],
                    "tid": tids[e["kind"]], "ts": (e["start"] - t0) * 1e6,
                    "dur": max(0.0, e["end"] - e["start"]) * 1e6, "args": args})
    for i, (s, r) in enumerate(match_messages(events)):
        out.append({"ph": "s", "id": i, "name": "message", "cat": "message", "pid": s["rank"],
                    "tid": tids["send"], "ts": (s["start"] - t0) * 1e6})
        out.append({"ph": "f", "bp": "e", "id": i, "name": "message", "cat": "message", "pid": r["rank"],
                    "tid": tids["recv"], "ts": (r["end"] - t0) * 1e6})
    trace = {"traceEvents": out, "displayTimeUnit": "ms"}
    if path is not None:
        with open(path, "w") as f:
            json.dump(trace, f)
    return trace


def match_messages(events: list[dict]) -> list[tuple[dict, dict]]:
    """Pair each send with the receive it fed: the k-th send from a to b matches the k-th
    receive on b from a (point-to-point messages between two ranks are not reordered)."""
    sends, recvs = {}, {}
    for e in sorted(events, key=lambda e: e["start"]):
        if e["kind"] == "send" and e["peer"] is not None:
            sends.setdefault((e["rank"], e["peer"]), []).append(e)
        elif e["kind"] == "recv" and e["peer"] is not None:
            recvs.setdefault((e["peer"], e["rank"]), []).append(e)
    return [pair for key, ss in sends.items() for pair in zip(ss, recvs.get(key, []))]
