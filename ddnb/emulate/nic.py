"""One network card per host, shared by the host's ranks (`Profile(shared_nic=True)`).

Without it every rank has its own inter-host link (a DGX node's eight NICs, one per GPU).
With it, the inter-host messages of all ranks of a host queue on the host's one NIC, in
each direction: a message holds it for alpha + n/B, as a rank's own link. The ranks are
separate processes, so the NIC's state lives in a file in shared memory (/dev/shm), one
per emulated cluster, locked with flock around each reservation.

A reservation takes the earliest gap on the NIC, at or after the message's ready time,
long enough for it (first fit over the busy intervals kept, `SLOTS` per NIC and
direction). Ranks reserve in real order, which pacing keeps close to emulated order; where
a message that is later in emulated time was reserved first and now delays an earlier one,
real order decided the time: the reservation is counted as a *conflict* (`Emulator.report`),
as an overrun is, and more slowdown removes it. Measured in `ddnb.bench.nic`; taught in
`notebooks/05_allreduce.ipynb`.
"""
from __future__ import annotations

import fcntl
import mmap
import os
from array import array

SLOTS = 256            # busy intervals kept per NIC and direction, newest last
_DOUBLES = 1 + 3 * SLOTS   # [count, (start, end, ready) x SLOTS]: a ring of the last SLOTS intervals


def memoryview_of(*values: float) -> memoryview:
    return memoryview(array("d", values))


class SharedNics:
    """The NICs of `hosts` hosts, shared by every rank of one emulated cluster (`key`)."""

    def __init__(self, key: str, hosts: int):
        self.path = f"/dev/shm/ddnb-nic-{os.getuid()}-{key}"
        self.hosts = hosts
        size = hosts * 2 * _DOUBLES * 8
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        with self._locked():
            if os.fstat(self.fd).st_size < size:
                os.ftruncate(self.fd, size)            # zeros: no interval yet
        self.map = mmap.mmap(self.fd, size)
        self.d = memoryview(self.map).cast("d")

    def _locked(self):
        fd = self.fd

        class _Lock:
            def __enter__(self):
                fcntl.flock(fd, fcntl.LOCK_EX)

            def __exit__(self, *exc):
                fcntl.flock(fd, fcntl.LOCK_UN)
        return _Lock()

    def reserve(self, host: int, direction: str, ready: float, seconds: float,
                tolerance: float = 0.0) -> tuple[float, bool]:
        """Hold host `host`'s NIC in `direction` ("out" or "in") for `seconds`, from the
        earliest time >= ready it is free that long; returns (start, conflict): conflict
        when an interval reserved earlier in real time, for a message that was ready more
        than `tolerance` after this one, pushed this one later (messages ready at nearly
        the same time may go in either order)."""
        eps = 1e-12 * max(1.0, abs(ready))      # intervals that touch do not overlap
        base = (host * 2 + (direction == "in")) * _DOUBLES
        with self._locked():
            count = int(self.d[base])
            kept = min(count, SLOTS)
            busy = sorted(tuple(self.d[base + 1 + 3 * i:base + 4 + 3 * i]) for i in range(kept))
            start, conflict = ready, False
            for a, b, theirs in busy:
                if b <= start + eps:
                    continue
                if a >= start + seconds - eps:
                    break
                conflict = conflict or theirs > ready + tolerance
                start = b
            slot = count % SLOTS
            self.d[base + 1 + 3 * slot:base + 4 + 3 * slot] = memoryview_of(start, start + seconds, ready)
            self.d[base] = count + 1
        return start, conflict

    def unlink(self) -> None:
        """Remove the file's name (once every rank has it mapped): the mappings live on, and
        nothing is left in /dev/shm however the processes end."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def close(self, unlink: bool = False) -> None:
        self.d.release()
        self.map.close()
        os.close(self.fd)
        if unlink:
            self.unlink()
