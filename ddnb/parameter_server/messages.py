"""The parameter server's wire protocol: what a worker and a server say to each other.

Every message is a small fixed-size header, (5,) float64 = 40 bytes,

    [kind, clock, version, loss, arg]

followed, for "push" and "params", by a payload: the flat float32 slice of the parameter
vector that the server holds (S_j bytes for shard j, S for a central server):

    worker -> server   pull    header                    "send me the parameters"
    worker -> server   push    header + gradient (S_j)   clock = the step it belongs to,
                                                         version = the parameters it used, loss
    worker -> server   done    header                    "I finished my steps"
    server -> worker   params  header + parameters (S_j) clock = the worker's step (as the
                                                         server counts it), version
    server -> worker   stop    header                    arg = the rank that was lost

so one step costs a worker one pull and one push per server, as in Li et al. 2014,
"Scaling Distributed Machine Learning with the Parameter Server" (OSDI), Sec. 3.1-3.2.
Headers and payloads go through `ddnb.collectives.p2p`, so each is a traced "send" /
"recv" event named after its message ("pull", "push", "params", "done", "stop").

A server cannot know which worker speaks next. On gloo (and "cpu:gloo,cuda:nccl", whose
CPU tensors go over gloo) its `Receiver` thread posts a receive from *any* source for the
next header, then receives that sender's payload; a pair of ranks never reorders its
messages (header, payload, header, ...), so a header receive never meets a payload. The
thread hands (src, header, payload) to the server's loop through a queue. It never waits
with a timeout: on gloo a timed-out wait closes the group's connections.

On a pure nccl group the messages live on the rank's GPU (`message_device`: nccl carries
CUDA tensors only) and nccl has no any-source receive, so `NamedReceiver` names its
sources: one header receive posted per worker, polled in the server's own thread, the
first one complete taken first (ASP and SSP still apply gradients in arrival order, to
within a poll of `POLL_S`; ties are taken in turn after the last rank served). nccl runs
a pair's sends and receives in order on one stream, so a receive left posted from a
worker that waits for "params" would hold that answer back for ever: the next header
receive from a worker is posted only once nothing is owed to it (after "params", or
after its push, whose next message needs no answer first). Taught in
`notebooks/04_parameter_server.ipynb`.
"""
from __future__ import annotations

import queue
import threading
import time

import torch
import torch.distributed as dist

from ddnb.collectives import p2p
from ddnb.trace import Tracer, get_tracer

PULL, PUSH, DONE, PARAMS, STOP = 1, 2, 3, 4, 5
NAMES = {PULL: "pull", PUSH: "push", DONE: "done", PARAMS: "params", STOP: "stop"}
FIELDS = ("kind", "clock", "version", "loss", "arg")
HEADER_BYTES = 8 * len(FIELDS)
POLL_S = 1e-4   # NamedReceiver: seconds between two looks at its posted receives


class ParameterServerError(RuntimeError):
    """Training stopped on purpose: a lost worker in synchronous mode, a stop message.
    `ranks` are the ranks the message names (the lost ones)."""

    def __init__(self, message: str, ranks=()):
        super().__init__(message)
        self.ranks = list(ranks)


def message_device(group=None) -> torch.device:
    """Where this rank's messages live: its GPU on a pure nccl group (nccl carries CUDA
    tensors only), else the host (gloo; "cpu:gloo,cuda:nccl" sends CPU tensors over gloo):
    `ddnb.collectives.ops.header_device`, the one rule."""
    from ddnb.collectives.ops import header_device

    return header_device(group)


def header(kind: int, clock: int = 0, version: int = 0, loss: float = float("nan"), arg: int = -1,
           device=None) -> torch.Tensor:
    """A header (5,) float64; float64 holds every integer below 2**53 exactly."""
    return torch.tensor([kind, clock, version, loss, arg], dtype=torch.float64, device=device)


def empty_header(device=None) -> torch.Tensor:
    return torch.zeros(len(FIELDS), dtype=torch.float64, device=device)


def decode(h: torch.Tensor) -> dict:
    """{"kind": "push", "clock": 3, "version": 12, "loss": 0.41, "arg": -1}."""
    kind, clock, version, loss, arg = h.tolist()
    return {"kind": NAMES.get(int(kind), f"unknown({kind})"), "clock": int(clock), "version": int(version),
            "loss": loss, "arg": int(arg)}


def send_message(kind: int, dst: int, group, tracer: Tracer | None = None, payload: torch.Tensor | None = None,
                 **fields) -> None:
    """Send a header (and a payload after it) to `dst`, both traced under the kind's name,
    from the group's `message_device`."""
    name, device = NAMES[kind], message_device(group)
    p2p.send(header(kind, device=device, **fields), dst, group, tracer, name=name)
    if payload is not None:
        p2p.send(payload.detach().to(device).contiguous(), dst, group, tracer, name=name)


def refuse_emulation() -> None:
    """The parameter server is not emulated: in an emulated cluster (`ddnb.emulate`) every
    message carries its sender's emulated time, which a raw any-source receive would not
    read. Raises on the rank that calls it (every rank calls it in `train`); the BSP step
    with fixed peers (`ddnb.parameter_server.saturation`) is the emulated one."""
    from ddnb.emulate import current

    if current() is not None:
        raise NotImplementedError("the parameter server is not emulated (receiving from any source is not in "
                                  "ddnb.emulate's message layer): run it in real mode, or use "
                                  "ddnb.parameter_server.saturation.train_fixed_peers, the same BSP step with "
                                  "fixed peers, which is emulated")


def recv_any(tensor: torch.Tensor, group, tracer: Tracer | None = None, name=None) -> int:
    """Receive into `tensor` from whichever rank of `group` sends first; returns its rank
    (within `group`). Traced as a "recv" from posting to arrival, named name(tensor) when
    `name` is a function of the received tensor."""
    refuse_emulation()
    start = time.time()
    work = dist.irecv(tensor, src=None, group=group)   # any source
    work.wait()
    src = work._source_rank()
    label = name(tensor) if callable(name) else (name or "recv")
    get_tracer(tracer).record("recv", label, start, time.time(), peer=src, nbytes=p2p.nbytes(tensor))
    return src


def wait_within(pending: p2p.Pending, timeout: float) -> None:
    """Complete a posted p2p message within `timeout` s or raise RuntimeError, recording
    its event (`p2p.Pending.wait`). A wait that times out breaks its group's connections,
    so use this only where the group is given up on failure."""
    pending.wait(timeout)


class Receiver(threading.Thread):
    """A server's receiving half: pulls every worker message off the wire, in arrival
    order, into `self.queue` as (src, header dict, payload or None). Stops after every
    rank in `workers` has said "done"; if one never does (it died), nothing can wake the
    thread (gloo cannot send to oneself), so it stays blocked in its receive until the
    group's timeout (`session_timeout`: 2·worker_timeout + 10 s), then exits quietly; its
    group is used by no later run. A worker that dies for real does not disturb the
    receive: messages of the other workers still arrive. An error becomes
    (None, exception, None)."""

    def __init__(self, group, payload_numel: int, workers, tracer: Tracer | None = None):
        super().__init__(name="ddnb-ps-receiver", daemon=True)
        self.group, self.numel, self.tracer = group, payload_numel, tracer
        self.open = set(workers)
        self.queue: queue.Queue = queue.Queue()

    def run(self) -> None:
        try:
            while self.open:
                h = empty_header()
                src = recv_any(h, self.group, self.tracer, name=lambda t: NAMES.get(int(t[0]), "header"))
                self.queue.put(_rest_of_message(self, src, h))
        except Exception as e:  # noqa: BLE001 - the server loop decides what it means
            self.queue.put((None, e, None))

    def get(self, timeout: float) -> tuple:
        """The next (src, header dict, payload or None); queue.Empty after `timeout` s."""
        return self.queue.get(timeout=timeout)

    def expect(self, src: int) -> None:
        """Nothing to do: the receive from any source already listens to `src`."""

    def close(self) -> None:
        """Nothing to do: the thread ends by itself (see the class docstring)."""


def _rest_of_message(rx, src: int, h: torch.Tensor) -> tuple:
    """After the header `h` from `src`: its payload for a push, `src` closed for a done."""
    msg, payload = decode(h), None
    if msg["kind"] == "push":
        payload = torch.empty(rx.numel, dtype=torch.float32, device=h.device)   # (S_j,)
        p2p.recv(payload, src, rx.group, rx.tracer, name="push")
    elif msg["kind"] == "done":
        rx.open.discard(src)
    return src, msg, payload


class NamedReceiver:
    """A server's receiving half on a group without an any-source receive (pure nccl):
    the same `get` / `expect` / `close` as `Receiver`, run in the server's own thread (no
    second thread issues nccl calls). One header receive from each worker that may speak
    next is posted (`expect`); `get` polls them every POLL_S s and takes the first that is
    complete, starting after the rank taken last, so that workers whose messages landed
    within one poll are taken in turn (see the module docstring)."""

    def __init__(self, group, payload_numel: int, workers, tracer: Tracer | None = None, device=None):
        self.group, self.numel, self.tracer = group, payload_numel, tracer
        self.device = device if device is not None else message_device(group)
        self.open = set(workers)
        self.posted: dict[int, p2p.Pending] = {}      # src -> its posted header receive
        self.heads: dict[int, torch.Tensor] = {}      # src -> (5,) header it is received into
        self.last = -1
        for w in sorted(self.open):
            self.expect(w)

    def start(self) -> None:
        """Nothing to start: `get` does the receiving (the same life cycle as `Receiver`)."""

    def join(self, timeout: float | None = None) -> None:
        """Nothing to wait for (the same life cycle as `Receiver`)."""

    def expect(self, src: int) -> None:
        """Post the receive of `src`'s next header, once nothing is owed to it."""
        if src in self.open and src not in self.posted:
            self.heads[src] = empty_header(self.device)
            self.posted[src] = p2p.irecv(self.heads[src], src, self.group, self.tracer, name="header")

    def get(self, timeout: float) -> tuple:
        """The first complete (src, header dict, payload or None); queue.Empty after `timeout` s."""
        deadline = time.monotonic() + timeout
        while True:
            ranks = sorted(self.posted)
            for src in [r for r in ranks if r > self.last] + [r for r in ranks if r <= self.last]:
                if self.posted[src].work.is_completed():
                    return self._take(src)
            if time.monotonic() >= deadline:
                raise queue.Empty
            time.sleep(POLL_S)

    def _take(self, src: int) -> tuple:
        pending, h = self.posted.pop(src), self.heads.pop(src)
        self.last = src
        try:
            pending.work.wait()
            pending.done = True
            get_tracer(self.tracer).record("recv", NAMES.get(int(h[0]), "header"), pending.start, time.time(),
                                           peer=src, nbytes=HEADER_BYTES)   # from posting to arrival
            out = _rest_of_message(self, src, h)
        except Exception as e:  # noqa: BLE001 - as Receiver: the server loop decides what it means
            return None, e, None
        if out[1]["kind"] == "push":
            self.expect(src)        # its next message (pull or done) needs no answer first
        return out

    def close(self) -> None:
        """A lost worker's header receive may still be posted: abort this run's group, or
        nccl's watchdog would take the process down when that receive times out."""
        if self.posted and self.group is not None and self.group is not dist.group.WORLD:
            self.group.abort()
        self.posted.clear()


def traffic(events: list[dict], world_size: int | None = None) -> dict:
    """Bytes each rank sent and received, in total and per message name, from traced
    events: {"sent": [..], "received": [..], "by_name": {name: {"sent": [..], "received": [..]}}}."""
    n = world_size if world_size is not None else 1 + max((e["rank"] for e in events), default=-1)
    out = {"sent": [0] * n, "received": [0] * n, "by_name": {}}
    for e in events:
        key = {"send": "sent", "recv": "received"}.get(e["kind"])
        if key is None:
            continue
        out[key][e["rank"]] += e["nbytes"]
        per = out["by_name"].setdefault(e["name"], {"sent": [0] * n, "received": [0] * n})
        per[key][e["rank"]] += e["nbytes"]
    return out
