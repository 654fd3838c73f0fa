"""Horovod without horovodrun.

`horovodrun --gloo` does three things before it starts the workers: it runs a small HTTP
rendezvous server (Horovod's Gloo contexts exchange their addresses through it), assigns
every process a slot (rank, local rank, cross rank, ...) with `get_host_assignments`, and
exports those values to each worker as HOROVOD_* environment variables. Here the notebook
(or the test process) does the same, so Horovod runs inside processes that already exist:
ipyparallel engines, or the processes of `ddnb.runtime.world`.

Sergeev & Del Balso, "Horovod: fast and easy distributed deep learning in TensorFlow"
(2018). Taught in `notebooks/00_getting_started.ipynb` and `notebooks/07_horovod.ipynb`.
"""
from __future__ import annotations

from collections import Counter


def horovod_available() -> bool:
    """True when Horovod is installed with its PyTorch extension."""
    try:
        import horovod.torch  # noqa: F401
    except Exception:
        return False
    return True


class HorovodRendezvous:
    """A Gloo rendezvous for `hosts` (one entry per rank, in rank order, e.g.
    ["localhost"] * 4, or ["node1", "node1", "node2", "node2"]).

    Ranks on the same host must be contiguous, as horovodrun assigns them; the slot of
    each rank then agrees with torch.distributed's rank.
    """

    def __init__(self, hosts: list[str], addr: str = "127.0.0.1", timeout: float = 60):
        from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
        from horovod.runner.http.http_server import RendezvousServer

        if not hosts:
            raise ValueError("HorovodRendezvous needs at least one host")
        order = list(dict.fromkeys(hosts))
        if [h for h in order for _ in range(Counter(hosts)[h])] != list(hosts):
            raise ValueError(f"ranks of one host must be contiguous, got hosts {hosts}")
        counts = Counter(hosts)
        plan = get_host_assignments(parse_hosts(",".join(f"{h}:{counts[h]}" for h in order)), len(hosts))
        self.slots = sorted(plan, key=lambda s: s.rank)
        for rank, (slot, host) in enumerate(zip(self.slots, hosts)):
            assert slot.rank == rank and slot.hostname == host, (slot, host)
        self.addr, self.timeout = addr, timeout
        self._server = RendezvousServer(verbose=0)
        self.port = self._server.start()
        self._server.init(plan)

    def env(self, rank: int, iface: str | None = None) -> dict:
        """The environment horovodrun would give `rank` (see horovod/runner/gloo_run.py)."""
        s = self.slots[rank]
        env = {
            "HOROVOD_HOSTNAME": s.hostname, "HOROVOD_RANK": s.rank, "HOROVOD_SIZE": s.size,
            "HOROVOD_LOCAL_RANK": s.local_rank, "HOROVOD_LOCAL_SIZE": s.local_size,
            "HOROVOD_CROSS_RANK": s.cross_rank, "HOROVOD_CROSS_SIZE": s.cross_size,
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": self.addr, "HOROVOD_GLOO_RENDEZVOUS_PORT": self.port,
            "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_GLOO_TIMEOUT_SECONDS": int(self.timeout),
            # lets hvd.start_timeline() capture a timeline later (0.28.1 refuses without it)
            "HOROVOD_TIMELINE": "DYNAMIC",
        }
        if iface is not None:
            env["HOROVOD_GLOO_IFACE"] = iface
        return {k: str(v) for k, v in env.items()}

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None


def shutdown_on_worker() -> None:
    """Runs on a worker: hvd.shutdown(), keeping torch.distributed."""
    import horovod.torch as hvd

    hvd.shutdown()


def this_host_address() -> str:
    """This machine's address, where the rendezvous server listens for other hosts."""
    import socket

    return socket.gethostbyname(socket.gethostname())


def check_settings(env: dict | None, ran: dict) -> None:
    """ValueError unless `env` holds only HOROVOD_* settings and no rank already ran Horovod
    with other ones (ran: rank -> the settings Horovod last started with in that process,
    None if never). Horovod 0.28.1 cannot start again in one process with changed settings:
    an hvd.init() after hvd.shutdown() with another cycle time or fusion threshold crashed
    every rank (segfault, exit 139) within 2-3 restarts here, under horovodrun too."""
    bad = [k for k in (env or {}) if not (isinstance(k, str) and k.startswith("HOROVOD_"))]
    if bad:
        raise ValueError(f"start_horovod: env keys must be HOROVOD_* settings, got {bad}")
    new = {k: str(v) for k, v in (env or {}).items()}
    other = {r: e for r, e in ran.items() if e is not None and e != new}
    if other:
        raise ValueError(f"start_horovod(env={new}): Horovod already ran in these engines with other settings "
                         f"(rank {min(other)}: {other[min(other)]}), and Horovod 0.28.1 crashes when it starts "
                         "again in the same process with changed settings; call cluster.restart() first")
