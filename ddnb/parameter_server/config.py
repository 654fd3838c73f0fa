"""The configuration of one parameter-server run (Li et al. 2014, "Scaling Distributed
Machine Learning with the Parameter Server", OSDI): how many server ranks, which
consistency model (BSP, SSP(s) or ASP, see `consistency.py`), the SGD steps, how the
parameters are sharded over the servers (`sharded.py`), and the faults to inject (a
straggler; a worker that goes silent or dies). `PSConfig.validate` lists every rule a
configuration breaks before any message is sent. Taught in
`notebooks/04_parameter_server.ipynb`.
"""
from __future__ import annotations

from dataclasses import dataclass

from ddnb.parameter_server.consistency import MODES
from ddnb.parameter_server.sharded import BY

FAIL_HOWS = ("silent", "exit")   # PSConfig.fail_how: the worker stops talking, or its process dies


@dataclass(frozen=True)
class PSConfig:
    """One parameter-server run. `validate(world_size)` checks it before anything is sent.

    servers         k server ranks (0..k-1); None: 1, or world_size when colocated
    mode            "bsp" (synchronous), "asp" (asynchronous) or "ssp" (bounded staleness)
    staleness       s of SSP(s): a worker may be s clocks ahead of the slowest (ssp only)
    steps, batch_size, lr, momentum, seed   per worker: steps of SGD on batches of batch_size
    shard_by        "bytes" or "layer" (see `partition`) when there are several servers
    colocated       every rank a worker and the server of one shard (bsp only)
    straggler_rank, straggler_delay   that worker sleeps straggler_delay s every step
    worker_timeout  s of silence after which a worker is lost (also bounds each co-located wait)
    fail_rank, fail_after_steps   that worker fails after that many steps, as `fail_how` says:
    fail_how        "silent" (it stops talking: a hung machine) or "exit" (its process dies for
                    real, mid-step, after pulling: run it with `cluster.run_surviving`)
    checkpoint_to, restore_from   path prefix: servers save their state at the end / start from it
    """
    servers: int | None = None
    mode: str = "bsp"
    staleness: int = 0
    steps: int = 100
    batch_size: int = 32
    lr: float = 0.1
    momentum: float = 0.0
    seed: int = 0
    shard_by: str = "bytes"
    colocated: bool = False
    straggler_rank: int | None = None
    straggler_delay: float = 0.0
    worker_timeout: float = 10.0
    fail_rank: int | None = None
    fail_after_steps: int = 0
    fail_how: str = "silent"
    checkpoint_to: str | None = None
    restore_from: str | None = None

    def num_servers(self, world_size: int) -> int:
        if self.servers is not None:
            return self.servers
        return world_size if self.colocated else 1

    def worker_ranks(self, world_size: int) -> list[int]:
        return list(range(world_size)) if self.colocated else list(range(self.num_servers(world_size), world_size))

    def validate(self, world_size: int) -> "PSConfig":
        """Raise ValueError listing every rule broken (with the values), else return self."""
        n, k, bad = world_size, self.num_servers(world_size), []
        is_int = lambda v: isinstance(v, int) and not isinstance(v, bool)  # noqa: E731
        if self.mode not in MODES:
            bad.append(f"mode={self.mode!r} is not one of {MODES}")
        if not is_int(k) or k < 1:
            bad.append(f"servers={k!r}: need an integer >= 1")
        elif self.colocated and k != n:
            bad.append(f"colocated=True makes every rank a server (servers=world_size={n}), got servers={k}")
        elif k > n:
            bad.append(f"servers={k} > world_size={n}: more servers than ranks")
        elif not self.colocated and n - k < 1:
            bad.append(f"servers={k} of world_size={n} leaves no worker (ranks 0..{k - 1} are servers, workers "
                       f"are ranks {k}..{n - 1}): need servers <= world_size - 1 = {n - 1}, or colocated=True")
        if self.colocated and self.mode != "bsp":
            bad.append(f"colocated=True needs mode='bsp', got mode={self.mode!r}: each step of the co-located "
                       f"exchange is a lock-step all-gather and reduce-scatter; serving a shard while computing "
                       f"(asp/ssp) would need a server thread on every rank")
        if not is_int(self.staleness) or self.staleness < 0:
            bad.append(f"staleness={self.staleness!r}: need an integer >= 0")
        elif self.staleness and self.mode != "ssp":
            bad.append(f"staleness={self.staleness} is only used by mode='ssp', got mode={self.mode!r}")
        for name in ("steps", "batch_size"):
            if not is_int(getattr(self, name)) or getattr(self, name) < 1:
                bad.append(f"{name}={getattr(self, name)!r}: need an integer >= 1")
        if not (isinstance(self.lr, (int, float)) and self.lr > 0):
            bad.append(f"lr={self.lr!r}: need a number > 0")
        if not (isinstance(self.momentum, (int, float)) and 0 <= self.momentum < 1):
            bad.append(f"momentum={self.momentum!r}: need 0 <= momentum < 1")
        if self.shard_by not in BY:
            bad.append(f"shard_by={self.shard_by!r} is not one of {BY}")
        if not (isinstance(self.worker_timeout, (int, float)) and self.worker_timeout > 0):
            bad.append(f"worker_timeout={self.worker_timeout!r}: need a number of seconds > 0")
        workers = self.worker_ranks(n) if is_int(k) and 1 <= k <= n else []
        for name in ("straggler_rank", "fail_rank"):
            r = getattr(self, name)
            if r is not None and r not in workers:
                bad.append(f"{name}={r!r} is not a worker rank (workers: {workers})")
        if not (isinstance(self.straggler_delay, (int, float)) and self.straggler_delay >= 0):
            bad.append(f"straggler_delay={self.straggler_delay!r}: need a number of seconds >= 0")
        elif isinstance(self.worker_timeout, (int, float)) and self.straggler_delay >= self.worker_timeout:
            bad.append(f"straggler_delay={self.straggler_delay} >= worker_timeout={self.worker_timeout}: the "
                       f"straggler would be declared lost; make worker_timeout larger")
        if self.fail_how not in FAIL_HOWS:
            bad.append(f"fail_how={self.fail_how!r} is not one of {FAIL_HOWS}")
        elif self.fail_how == "exit" and self.colocated:
            bad.append("fail_how='exit' with colocated=True: a co-located rank is also a server; its death "
                       "takes its shard with it, so nothing can go on")
        if not is_int(self.fail_after_steps) or not (0 <= self.fail_after_steps < max(self.steps, 1)):
            bad.append(f"fail_after_steps={self.fail_after_steps!r}: need 0 <= fail_after_steps < steps={self.steps}")
        if bad:
            raise ValueError(f"invalid PSConfig for world_size={n}: " + "; ".join(bad))
        return self
