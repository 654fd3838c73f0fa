"""The configuration of one decentralized run, shared by every method of
`ddnb.decentralized`, and validated before any message is sent.

    DecentralizedConfig(topology="ring", steps=100, batch_size=32, lr=0.1)

Every rank is a worker (there is no server rank); worker r trains on shard r of the data
with the batches of `ddnb.parameter_server.worker_batch`, so that all methods, the
parameter server of notebook 04 and the single-process references draw the same examples
at the same step. Plain SGD (no momentum): the equivalences (complete-graph D-PSGD = local
SGD with H = 1 = all-reduce SGD) are then exact, step for step.
Taught in `notebooks/05b_decentralized.ipynb`.
"""
from __future__ import annotations

from dataclasses import dataclass

from ddnb._checks import Checks, is_int, is_number

ORDERS = ("atc", "lian")


@dataclass(frozen=True)
class DecentralizedConfig:
    """One decentralized run. `validate(world_size)` lists every broken rule at once.

    topology        "ring", "torus", "exponential", "complete" (`topology.TOPOLOGIES`), a
                    Topology, or an (N, N) mixing matrix W
    steps, batch_size, lr, seed   per worker: steps of plain SGD on batches of batch_size
    gossip_steps    D-PSGD: gossip (mixing) steps per SGD step (W applied that many times)
    order           D-PSGD: "atc" x <- W^k (x - lr g(x)) (adapt, then combine; Koloskova et al.
                    2020, Alg. 1), or "lian" x <- W^k x - lr g(x), the gossip overlapped with
                    the gradient (Lian et al. 2017, Alg. 1)
    local_steps     H: local SGD averages every H steps; EASGD's communication period tau
    warmup_steps    local SGD: steps with H = 1 first ("post-local SGD", Lin et al. 2020)
    alpha           EASGD's elastic moving rate; None: 0.9 / N (beta = N alpha = 0.9, the
                    paper's choice, Zhang et al. 2015, Sec. 5)
    straggler_rank, straggler_delay   that rank sleeps straggler_delay s after each gradient
    measure_every   consensus distance (and accuracy, given a test set) every that many steps
    """
    # Typed fields with defaults, as PSConfig's (ddnb/parameter_server/config.py): alike in shape only.
    topology: object = "ring"
    steps: int = 100
    batch_size: int = 32
    lr: float = 0.1
    seed: int = 0
    gossip_steps: int = 1
    order: str = "atc"
    local_steps: int = 1
    warmup_steps: int = 0
    alpha: float | None = None
    straggler_rank: int | None = None
    straggler_delay: float = 0.0
    measure_every: int = 10

    def elastic(self, world_size: int) -> float:
        """EASGD's alpha for `world_size` workers."""
        return 0.9 / world_size if self.alpha is None else self.alpha

    def validate(self, world_size: int, dataset_size: int | None = None) -> "DecentralizedConfig":
        """Raise ValueError naming every bad field (with its value), else return self.
        The topology is built and checked too (doubly stochastic, connected)."""
        from ddnb.decentralized.topology import topology

        n = world_size
        with Checks(f"invalid DecentralizedConfig for world_size={n}") as check:
            check.integer("world_size", n, min=1)
            check.positive_ints(steps=self.steps, batch_size=self.batch_size, measure_every=self.measure_every)
            check.number("lr", self.lr, positive=True)
            check.integer("seed", self.seed, min=0)
            check.integer("gossip_steps", self.gossip_steps, min=1, why=" (mixing steps per SGD step)")
            check.choice("order", self.order, ORDERS)
            check.integer("local_steps", self.local_steps, min=1,
                          why=" (H, the steps between two averagings: H = 1 averages every step)")
            check.integer("warmup_steps", self.warmup_steps, min=0)
            if is_int(n) and n >= 1 and check.number("alpha", self.alpha, positive=True, none=True):
                a = self.elastic(n)
                check.rule(n * a <= 1, f"alpha={a:g} with {n} workers: need N * alpha <= 1 (EASGD's center "
                                       f"x~ <- (1 - N alpha) x~ + alpha sum_i x_i must stay an average)")
            check.rule(self.straggler_rank is None or (is_int(self.straggler_rank) and 0 <= self.straggler_rank < n),
                       f"straggler_rank={self.straggler_rank!r} is not a rank (0..{n - 1})")
            check.number("straggler_delay", self.straggler_delay, min=0, why=" (seconds)")
            if dataset_size is not None and is_int(self.batch_size) and is_int(n) and n >= 1:
                check.rule(self.batch_size <= dataset_size // n, f"batch_size={self.batch_size} > "
                           f"{dataset_size // n} examples in the smallest worker shard ({dataset_size} over {n})")
            if is_int(n) and n >= 1:
                try:
                    topology(self.topology, n)
                except ValueError as e:
                    check.rule(False, str(e))
        return self


def straggle(config: DecentralizedConfig, rank: int, tracer) -> None:
    """Sleep `straggler_delay` s if this rank is the straggler (traced as "straggler delay")."""
    import time

    if config.straggler_rank == rank and is_number(config.straggler_delay) and config.straggler_delay > 0:
        with tracer.span("other", "straggler delay"):
            time.sleep(config.straggler_delay)
