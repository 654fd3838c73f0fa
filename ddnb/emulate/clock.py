"""The emulated clock of one worker, and its links.

Every worker keeps `t`, the emulated time (seconds since the cluster's epoch) at which it
has finished all it was given. Work advances it; real time is kept in step with it:

- **compute** adds its modeled time to `t` (`charge`, from `ddnb.emulate.compute`);
- a **message** leaves when the sender's outgoing link is free and `t` has come, and
  takes alpha + n / B of its link (Hockney's model, the one `ddnb.cost` uses): it holds
  the sender's outgoing link and the receiver's incoming link for that long (the two
  overlap), so a rank's messages queue on its link, latency included, as the alpha-beta
  model's linear gather assumes; the receiver's `t` becomes at least the arrival time
  (`send_start`, `arrival`). The sender puts its start time in a small header
  that travels with the real bytes (`ddnb.emulate.messages`), so the arrival time comes
  from the real message the real program sent;
- before anything another process can see (a message, a collective, a reading of the
  clock), the worker **syncs**: it sleeps until real time reaches `t x slowdown`, so the
  real run keeps the emulated one's pace and order. If real time is already later (the
  real work, or the wait for a CPU that other ranks' real work holds, took longer than its
  model), the sync **lags**. In a rank whose clock only its own thread moves, a lag
  changes no emulated time: every time is computed from the model, the headers and the
  program's order (one virtual clock per rank, as SimGrid's SMPI), so the same program
  gives the same emulated times at any slowdown (tested). Where another thread of the rank
  also moves its clock (a communication thread, `ddnb.data_parallel.bucketed` with its own
  all-reduce), which of the two threads comes first follows real time: there a lag of more
  than the rank's `tolerance` (`TOLERANCE_ALPHAS` of the profile's smallest alpha) is an
  **overrun**. It is counted, `t` moves to the real
  time (the time printed is then the real one, too slow), and `report()` says so; raise
  the slowdown until there are none.

Modeled: one full-duplex link per rank and kind (intra-host, inter-host), so a rank's
messages share its link in each direction (a NIC serializes), each holding it for
alpha + n / B.
With `Profile(shared_nic=True)` the ranks of a host share one inter-host link in each
direction (`ddnb.emulate.nic`: a host's NIC, its state shared by the host's processes).
Not modeled: switch contention and oversubscribed fabrics (every pair has full
bandwidth), congestion control, the CPU cost of sending (zero-copy, as RDMA). torch.distributed's own collectives (DDP's buckets,
the traced layer's all-reduce, all-gather and barrier) take the time of the messages of
the algorithm they run, sent for real on a `stream` (`ddnb.emulate.messages`); Horovod
is not emulated.
Taught in `notebooks/05_allreduce.ipynb`.
"""
from __future__ import annotations

import importlib
import contextlib
import threading
import time

from ddnb.emulate.profile import Profile

# How late a sync may wake without counting (as a lag, and in a rank with a second thread on
# its clock as an overrun), as a fraction of the profile's smallest alpha: a lateness under
# half a message's latency cannot reorder two messages. Every sync's lateness is kept and
# reported as a distribution (`lateness`). Sleeping to a deadline wakes a median 0.15 ms
# late here (p95 1.0-1.6 ms with 8-16 processes on 2 cores), so at slowdown x a profile
# whose alpha is under ~2 ms / x counts lags that change nothing in a single-threaded rank.
TOLERANCE_ALPHAS = 0.5
LATENESS_SAMPLES = 100_000   # the most syncs whose lateness a rank keeps


class Emulator:
    """The emulated clock and link state of one rank in a world of `world_size`."""

    def __init__(self, profile: Profile, rank: int, world_size: int, epoch: float):
        self.profile, self.rank, self.world_size, self.epoch = profile, rank, world_size, epoch
        self.lock = threading.RLock()
        self._local = threading.local()      # .stream: [t] of a collective's timeline (`stream`)
        self.owner = threading.get_ident()   # the thread that activated emulation (the rank's main thread)
        # emulated seconds a sync may be late without counting (see TOLERANCE_ALPHAS)
        self.tolerance = TOLERANCE_ALPHAS * min(profile.intra.alpha, profile.inter.alpha)
        self.nics = None
        if profile.shared_nic and profile.ranks_per_host > 1 and world_size > profile.ranks_per_host:
            from ddnb.emulate.nic import SharedNics

            self.nics = SharedNics(f"{epoch:.9f}", profile.host(world_size - 1) + 1)
        self.reset()

    def reset(self) -> None:
        """Start the clock at real time again, with free links and no counts."""
        self.t = max(0.0, self.real_now())
        self.comm_free = 0.0       # emulated time this rank's last collective ended (`stream`)
        self.free = {}             # (direction, link kind) -> emulated time the link is free
        self.syncs = self.overruns = self.lags = 0
        self.overrun_time = self.max_overrun = 0.0   # emulated seconds
        self.max_lag = 0.0                           # real seconds
        self.late = []             # each sync's lateness, emulated seconds (0: on time)
        self.threaded = False      # has a thread other than `owner` moved this clock?
        self.pending_collectives = None   # a backward pass's DDP buckets (`messages.EmulatedAllReduce`)
        self.flops = self.compute_time = 0.0
        self.messages = self.bytes_sent = 0
        self.nic_conflicts = 0     # shared-NIC reservations whose order real time decided (`ddnb.emulate.nic`)
        self.unmodeled = {}        # torch.distributed op -> calls made outside the message layer

    @contextlib.contextmanager
    def warm_up(self):
        """Leave the block's syncs and overruns out of this rank's counts; the clock and the
        links go on. For the untimed first step of a run: it pays one-time costs (memory
        allocations, autograd's first graph, gloo's first use of a pair) that its model
        leaves out, and its times are not reported, so its overruns say nothing about them."""
        with self.lock:
            saved = (self.syncs, self.overruns, self.overrun_time, self.max_overrun, self.lags, self.max_lag)
        try:
            yield
        finally:
            with self.lock:
                self.syncs, self.overruns, self.overrun_time, self.max_overrun, self.lags, self.max_lag = saved

    # ------------------------------------------------------------------ time
    @property
    def t(self) -> float:
        """This rank's emulated time; inside `stream`, the collective's own."""
        s = getattr(self._local, "stream", None)
        return self._t if s is None else s[0]

    @t.setter
    def t(self, value: float) -> None:
        s = getattr(self._local, "stream", None)
        if s is None:
            self._t = value
        else:
            s[0] = value

    @contextlib.contextmanager
    def stream(self, launch: float):
        """A collective's own timeline, as a GPU's communication stream: inside the block this
        thread's messages start from the stream's time, which begins at `launch` or when
        this rank's previous collective ended (collectives run one after another, as
        gloo's and NCCL's do), and the rank's own `t` is left alone, so the collective
        overlaps the compute that follows its launch. The block can run after that compute
        (a DDP bucket's messages are sent at the end of backward, in program order): its
        syncs neither sleep nor lag, since every time in it comes from the headers. Yields
        [t]; afterwards t[0] is the collective's end on this rank."""
        with self.lock:
            s = [max(launch, self.comm_free)]
        previous, self._local.stream = getattr(self._local, "stream", None), s
        try:
            yield s
        finally:
            self._local.stream = previous
            with self.lock:
                self.comm_free = max(self.comm_free, s[0])

    def in_stream(self) -> bool:
        return getattr(self._local, "stream", None) is not None

    def real_now(self) -> float:
        """Real time since the epoch, in emulated seconds."""
        return (time.monotonic() - self.epoch) / self.profile.slowdown

    def charge(self, seconds: float, flops: float = 0.0) -> None:
        """Add `seconds` of modeled work to this rank's time (no sleep yet)."""
        with self.lock:
            self.t += seconds
            self.compute_time += seconds
            self.flops += flops

    def _mark_thread(self) -> None:
        if threading.get_ident() != self.owner:
            self.threaded = True

    def advance_to(self, t: float) -> None:
        self._mark_thread()
        with self.lock:
            self.t = max(self.t, t)

    def sync(self) -> float:
        """Sleep until real time reaches `t`; returns `t`. Its lateness is kept; a lag
        beyond `tolerance` is counted; it is an overrun (and moves `t` to the real time) only in a rank where
        another thread also moves the clock (see the module docstring)."""
        if self.in_stream():
            return self.t
        self._mark_thread()
        with self.lock:
            target = self.t
            self.syncs += 1
        late = self.real_now() - target
        if len(self.late) < LATENESS_SAMPLES:
            self.late.append(max(late, 0.0))
        if late < 0:
            time.sleep(-late * self.profile.slowdown)
        elif late > self.tolerance:
            with self.lock:
                self.lags += 1
                self.max_lag = max(self.max_lag, late * self.profile.slowdown)
                if self.threaded:
                    self.overruns += 1
                    self.overrun_time += late
                    self.max_overrun = max(self.max_overrun, late)
                    self.t = max(self.t, target + late)
        return self.t

    def resume(self) -> float:
        """A new task starts on an idle worker: the real time it sat idle is not work and
        not an overrun, so `t` catches up with real time (ranks realign at their next
        barrier or message)."""
        with self.lock:
            self.t = max(self.t, self.real_now())
            return self.t

    def now(self) -> float:
        """The emulated time, after a sync."""
        return self.sync()

    # ------------------------------------------------------------------ links
    def _kind(self, peer: int) -> str:
        return "intra" if self.profile.host(peer) == self.profile.host(self.rank) else "inter"

    def send_start(self, dst: int, nbytes: int) -> tuple[float, float]:
        """A message of `nbytes` to global rank `dst` leaves now: (start, end) of the
        alpha + n / B it holds this rank's outgoing link. Call after sync()."""
        kind = self._kind(dst)
        link = getattr(self.profile, kind)
        with self.lock:
            start = max(self.t, self.free.get(("out", kind), 0.0))
            if self.nics is not None and kind == "inter":
                start = self._reserve("out", start, link.time(nbytes))
            end = start + link.time(nbytes)
            self.free[("out", kind)] = end
            self.messages += 1
            self.bytes_sent += nbytes
        return start, end

    def arrival(self, src: int, start: float, nbytes: int) -> float:
        """When a message that left global rank `src` at emulated time `start` has
        arrived here: alpha + n / B on this rank's incoming link, once it is free."""
        kind = self._kind(src)
        link = getattr(self.profile, kind)
        self._mark_thread()
        with self.lock:
            begin = max(start, self.free.get(("in", kind), 0.0))
            if self.nics is not None and kind == "inter":
                begin = self._reserve("in", begin, link.time(nbytes))
            end = begin + link.time(nbytes)
            self.free[("in", kind)] = end
        return end

    def _reserve(self, direction: str, ready: float, seconds: float) -> float:
        """The start of a message on this host's shared NIC (`ddnb.emulate.nic`)."""
        start, conflict = self.nics.reserve(self.profile.host(self.rank), direction, ready, seconds,
                                            TOLERANCE_ALPHAS * self.profile.inter.alpha)   # a NIC's own latency
        self.nic_conflicts += conflict
        return start

    def shared(self) -> None:
        """Every rank has opened what it shares (after a barrier): its name can go."""
        if self.nics is not None and self.rank == 0:
            self.nics.unlink()

    def close(self) -> None:
        """Release what this rank shares with the others (the host NICs' state)."""
        if self.nics is not None:
            self.nics.close(unlink=self.rank == 0)
            self.nics = None

    # ------------------------------------------------------------------ report
    def count_unmodeled(self, op: str) -> None:
        """A torch.distributed call outside ddnb's emulated message layer: it ran for real
        but took no emulated time (`ddnb.emulate.compute`)."""
        with self.lock:
            self.unmodeled[op] = self.unmodeled.get(op, 0) + 1

    def report(self) -> dict:
        """This rank's counts: syncs, overruns, their emulated seconds, compute charged."""
        with self.lock:
            return {"rank": self.rank, "profile": self.profile.name, "time": self.t, "syncs": self.syncs,
                    "overruns": self.overruns, "overrun_time": self.overrun_time,
                    "max_overrun": self.max_overrun, "lags": self.lags, "max_lag": self.max_lag,
                    "threaded": self.threaded, "tolerance": self.tolerance,
                    "lateness": lateness_stats(self.late), "flops": self.flops, "compute_time": self.compute_time,
                    "messages": self.messages, "bytes_sent": self.bytes_sent,
                    "nic_conflicts": self.nic_conflicts, "unmodeled": dict(self.unmodeled)}


def lateness_stats(late: list[float]) -> dict:
    """{"syncs", "p50", "p95", "max"} of lateness samples (emulated seconds)."""
    if not late:
        return {"syncs": 0, "p50": 0.0, "p95": 0.0, "max": 0.0}
    xs = sorted(late)
    q = lambda f: xs[min(len(xs) - 1, int(f * len(xs)))]   # noqa: E731
    return {"syncs": len(xs), "p50": q(0.5), "p95": q(0.95), "max": xs[-1]}


def lateness(reports: list[dict]) -> dict:
    """The lateness of every rank's syncs, pooled: {"syncs", "p50", "p95", "max" (emulated
    seconds, each the worst rank's), "tolerance", "lags"}. Under the tolerance a lateness
    is reported here, never counted; in a single-threaded rank none changes a time."""
    reports = [r for r in reports if r and "lateness" in r]
    if not reports:
        return {}
    stats = [r["lateness"] for r in reports]
    return {"syncs": sum(s["syncs"] for s in stats), "p50": max(s["p50"] for s in stats),
            "p95": max(s["p95"] for s in stats), "max": max(s["max"] for s in stats),
            "tolerance": min(r["tolerance"] for r in reports), "lags": sum(r["lags"] for r in reports)}


_EMULATOR: Emulator | None = None


def current() -> Emulator | None:
    """This process's emulator, or None in real mode."""
    return _EMULATOR


def install(emulator: Emulator | None) -> None:
    """Make `emulator` this process's (None: real mode). Called by `ddnb.emulate.session`,
    which starts and stops a worker's emulation; nothing else sets it."""
    global _EMULATOR
    _EMULATOR = emulator


def warm_up(untimed: bool = True):
    """`with warm_up(step == 0):` a run's untimed step, whose overruns are not counted
    (`Emulator.warm_up`); does nothing in real mode or when `untimed` is False."""
    if _EMULATOR is None or not untimed:
        return contextlib.nullcontext()
    return _EMULATOR.warm_up()


def stamp() -> float:
    """A time for a trace event: time.time() in real mode; in an emulated cluster this
    rank's emulated time, without waiting for real time to catch up."""
    return time.time() if _EMULATOR is None else _EMULATOR.t


def resume() -> None:
    """Call at the start of each task a worker runs (World and Cluster do)."""
    if _EMULATOR is not None:
        _EMULATOR.resume()


def report() -> dict | None:
    """This rank's emulation report (None in real mode)."""
    return None if _EMULATOR is None else _EMULATOR.report()


def summary(reports: list[dict]) -> str:
    """One line for all ranks' reports: whether every operation kept to its model, and
    which torch.distributed calls ran outside the emulated message layer (untimed)."""
    reports = [r for r in reports if r]
    if not reports:
        return "real mode: nothing emulated"
    over = [r for r in reports if r["overruns"]]
    syncs = sum(r["syncs"] for r in reports)
    name = reports[0]["profile"]
    if not over:
        line = f"emulated '{name}': no overruns in {syncs} syncs (every operation kept to its modeled time)"
    else:
        worst = max(r["max_overrun"] for r in over)
        line = (f"emulated '{name}': {sum(r['overruns'] for r in over)} overruns in {syncs} syncs on rank(s) "
                f"{', '.join(str(r['rank']) for r in over)} (worst {worst * 1e3:.3f} emulated ms): real work "
                f"took longer than its model there, so those times are too slow; raise slowdown")
    conflicts = sum(r.get("nic_conflicts", 0) for r in reports)
    if conflicts:
        line += (f"; {conflicts} shared-NIC reservations were ordered by real time, not emulated time "
                 f"(those messages' times may be late): raise slowdown")
    unmodeled = {}
    for r in reports:
        for op, k in r.get("unmodeled", {}).items():
            unmodeled[op] = unmodeled.get(op, 0) + k
    if unmodeled:
        calls = ", ".join(f"{op} x{k}" for op, k in sorted(unmodeled.items()))
        line += (f"; torch.distributed calls outside ddnb's emulated layer took no emulated time ({calls} over "
                 f"all ranks): use ddnb.emulate.messages or ddnb.timing.barrier_and_clock for timed ones")
    return line
