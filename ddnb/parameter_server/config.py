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

from ddnb._checks import Checks, is_int
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
    # Typed fields with defaults, as GPTConfig's (ddnb/models.py): alike in shape only.
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
        n, k = world_size, self.num_servers(world_size)
        with Checks(f"invalid PSConfig for world_size={n}") as check:
            check.choice("mode", self.mode, MODES)
            if check.integer("servers", k, min=1):
                if self.colocated:
                    check.rule(k == n, f"colocated=True makes every rank a server (servers=world_size={n}), "
                                       f"got servers={k}")
                elif check.rule(k <= n, f"servers={k} > world_size={n}: more servers than ranks"):
                    check.rule(n - k >= 1, f"servers={k} of world_size={n} leaves no worker (ranks 0..{k - 1} are "
                                           f"servers, workers are ranks {k}..{n - 1}): need servers <= world_size "
                                           f"- 1 = {n - 1}, or colocated=True")
            check.rule(not self.colocated or self.mode == "bsp", f"colocated=True needs mode='bsp', got "
                       f"mode={self.mode!r}: each step of the co-located exchange is a lock-step all-gather and "
                       f"reduce-scatter; serving a shard while computing (asp/ssp) would need a server thread on "
                       f"every rank")
            if check.integer("staleness", self.staleness, min=0):
                check.rule(not self.staleness or self.mode == "ssp",
                           f"staleness={self.staleness} is only used by mode='ssp', got mode={self.mode!r}")
            check.positive_ints(steps=self.steps, batch_size=self.batch_size)
            check.number("lr", self.lr, positive=True)
            check.number("momentum", self.momentum, min=0, below=1)
            check.choice("shard_by", self.shard_by, BY)
            timeout_ok = check.number("worker_timeout", self.worker_timeout, positive=True, why=" (seconds)")
            workers = self.worker_ranks(n) if is_int(k) and 1 <= k <= n else []
            for name in ("straggler_rank", "fail_rank"):
                r = getattr(self, name)
                check.rule(r is None or r in workers, f"{name}={r!r} is not a worker rank (workers: {workers})")
            if check.number("straggler_delay", self.straggler_delay, min=0, why=" (seconds)") and timeout_ok:
                check.rule(self.straggler_delay < self.worker_timeout, f"straggler_delay={self.straggler_delay} >= "
                           f"worker_timeout={self.worker_timeout}: the straggler would be declared lost; make "
                           f"worker_timeout larger")
            if check.choice("fail_how", self.fail_how, FAIL_HOWS):
                check.rule(not (self.fail_how == "exit" and self.colocated), "fail_how='exit' with colocated=True: "
                           "a co-located rank is also a server; its death takes its shard with it, so nothing can "
                           "go on")
            steps = self.steps if is_int(self.steps) else 1
            check.rule(is_int(self.fail_after_steps) and 0 <= self.fail_after_steps < max(steps, 1),
                       f"fail_after_steps={self.fail_after_steps!r}: need 0 <= fail_after_steps < steps={self.steps}")
        return self
