"""`Layout`: one way to lay the small GPT out on a dp × pp × tp × cp grid, checked before
any process blocks, and `feasible_layouts`: every one that fits a model on N workers.

    lay = Layout(dp=2, pp=2, tp=2, cp=2, zero=1, checkpointing=True, microbatches=2)
    lay.validate(config, world_size=16, batch_size=8)   # ValueError listing every problem
    feasible_layouts(16, config, batch_size=16)         # [Layout(...), ...]

The rules, each the divisibility one parallelism needs (Narayanan et al. 2021, "Efficient
Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", Sec. 2.3 and 3):

    dp · pp · tp · cp = world_size     every rank one position of the grid
    n_layers % pp == 0                 every pipeline stage the same number of blocks
    n_heads % tp, vocab_size % tp,     tensor parallelism splits whole heads, the
    (mlp_ratio · d_model) % tp == 0    vocabulary and the MLP's hidden units
    seq_len % cp == 0                  context parallelism gives each rank S/cp positions
    batch_size % (dp · microbatches)   each dp rank's rows cut into equal micro-batches
    zero > 0 needs dp · cp > 1         ZeRO shards over the dp·cp ranks that hold the same
                                       parameters; over one rank it shards nothing

ZeRO-2 and ZeRO-3 with pp > 1 run and are allowed: each micro-batch's backward
reduce-scatters the stage's gradients (ZeroStage2 adds them into the shard), and under
ZeRO-3 each micro-batch's forward and backward all-gather the parameters again, m times
the traffic of pp = 1 (`ddnb.cost.layout` prices it the same way). That traffic is why
DeepSpeed's pipeline engine refuses ZeRO stages 2 and 3; at this size it costs little.
`Layout.from_plan` reads a row of `ddnb.cost.planner.plan` (or its `Layout`), so the
planner's top layouts can be trained. Taught in
`notebooks/16_capstone.ipynb` (it combines chapters 09, 10, 11 and 13).
"""
from __future__ import annotations

from dataclasses import dataclass

from ddnb._checks import Checks, is_int
from ddnb.models import GPTConfig

AXES = ("dp", "pp", "tp", "cp")
SCHEDULES = ("1f1b", "gpipe")
ZERO_STAGES = (0, 1, 2, 3)


@dataclass(frozen=True)
class Layout:
    """dp × pp × tp × cp ranks, ZeRO stage 0-3 over the dp·cp ranks, activation
    checkpointing of every block, and the micro-batches each pipeline runs per step."""

    dp: int = 1
    pp: int = 1
    tp: int = 1
    cp: int = 1
    zero: int = 0
    checkpointing: bool = False
    microbatches: int = 1
    schedule: str = "1f1b"

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.tp * self.cp

    def problems(self, config: GPTConfig, world_size: int | None = None, batch_size: int | None = None) -> list[str]:
        """Every rule this layout breaks for `config` on `world_size` ranks with a global
        batch of `batch_size` sequences ([] when it can run)."""
        check = Checks()
        sizes = {a: getattr(self, a) for a in AXES}
        if not check.positive_ints(**sizes, microbatches=self.microbatches):
            return check.problems
        product = " * ".join(f"{a}({v})" for a, v in sizes.items())
        if world_size is not None:
            check.rule(self.world_size == world_size, f"{product} != world_size({world_size})")
        check.choice("zero", self.zero, ZERO_STAGES)
        check.choice("schedule", self.schedule, SCHEDULES)
        check.rule(isinstance(self.checkpointing, bool), f"checkpointing={self.checkpointing!r}: need True or False")
        c, hidden = config, config.mlp_ratio * config.d_model
        check.rule(c.n_layers % self.pp == 0, f"n_layers({c.n_layers}) % pp({self.pp}) = {c.n_layers % self.pp}: "
                   f"every pipeline stage needs the same number of blocks")
        for what, value in (("n_heads", c.n_heads), ("vocab_size", c.vocab_size), ("MLP hidden", hidden)):
            check.rule(value % self.tp == 0, f"{what}({value}) % tp({self.tp}) = {value % self.tp}: tensor "
                       f"parallelism splits whole heads, vocabulary rows and hidden units")
        check.rule(c.seq_len % self.cp == 0, f"seq_len({c.seq_len}) % cp({self.cp}) = {c.seq_len % self.cp}: "
                   f"context parallelism gives every rank seq_len / cp positions")
        if batch_size is not None and check.integer("batch_size", batch_size, min=1):
            rows = self.dp * self.microbatches
            check.rule(batch_size % rows == 0, f"batch_size({batch_size}) % (dp({self.dp}) * "
                       f"microbatches({self.microbatches})) = {batch_size % rows}: every dp rank's rows "
                       f"split into equal micro-batches")
        if self.zero in (1, 2, 3):
            check.rule(self.dp * self.cp > 1, f"zero({self.zero}) with dp({self.dp}) * cp({self.cp}) = 1 shards "
                       f"nothing (the same layout as zero 0)")
        return check.problems

    def validate(self, config: GPTConfig, world_size: int | None = None, batch_size: int | None = None) -> "Layout":
        """ValueError listing every problem (`problems`), raised before any process
        blocks; returns the layout when it can run."""
        found = self.problems(config, world_size, batch_size)
        if found:
            raise ValueError(f"{self}: " + "; ".join(found))
        return self

    @classmethod
    def from_plan(cls, row, batch_size: int, schedule: str = "1f1b") -> "Layout":
        """The Layout of one of `ddnb.cost.planner.plan`'s rows (a dict) or of its
        `ddnb.cost.layout.Layout`: dp, pp, tp, cp, zero, checkpointing, and microbatches =
        batch_size / (dp · microbatch_size) where the row gives a micro-batch size. Model
        chunks (interleaved 1F1B) are not run here: chunks > 1 raises."""
        get = (lambda k, d=None: row.get(k, d)) if isinstance(row, dict) else (lambda k, d=None: getattr(row, k, d))
        chunks = get("chunks", 1)
        if chunks not in (None, 1):
            raise ValueError(f"Layout.from_plan: chunks({chunks}) > 1 (interleaved 1F1B) is not run by train_4d; "
                             f"plan with chunks=(1,)")
        m, b, dp = get("microbatches"), get("microbatch_size"), get("dp", 1)
        if m is None and b is not None:
            if not (is_int(b) and b >= 1 and batch_size % (dp * b) == 0):
                raise ValueError(f"Layout.from_plan: batch_size({batch_size}) % (dp({dp}) * "
                                 f"microbatch_size({b})) != 0")
            m = batch_size // (dp * b)
        return cls(dp=dp, pp=get("pp", 1), tp=get("tp", 1), cp=get("cp", 1), zero=get("zero", 0),
                   checkpointing=bool(get("checkpointing", False)), microbatches=m or 1, schedule=schedule)

    def __str__(self) -> str:
        ckpt = ", checkpointing" if self.checkpointing else ""
        return (f"dp{self.dp} x pp{self.pp} x tp{self.tp} x cp{self.cp} (zero {self.zero}{ckpt}, "
                f"{self.microbatches} microbatches, {self.schedule})")


def factorizations(n: int, axes: int = 4) -> list[tuple[int, ...]]:
    """Every ordered tuple of `axes` positive integers with product n, in lexicographic order."""
    if axes == 1:
        return [(n,)]
    return [(k,) + rest for k in range(1, n + 1) if n % k == 0 for rest in factorizations(n // k, axes - 1)]


def default_microbatches(batch_size: int, dp: int, pp: int) -> int:
    """pp micro-batches (a 1F1B pipeline with every stage busy once it is full) where
    the dp rank's rows split into pp, else the largest number below pp that divides them."""
    rows = batch_size // dp if batch_size % dp == 0 else 0
    return max([m for m in range(1, pp + 1) if rows and rows % m == 0], default=1)


def feasible_layouts(workers: int = 16, config: GPTConfig | None = None, batch_size: int = 16,
                     zero_stages=ZERO_STAGES, checkpointing=(False,), microbatches=None,
                     schedule: str = "1f1b") -> list[Layout]:
    """Every dp × pp × tp × cp layout of `workers` ranks (each ZeRO stage of `zero_stages`
    and each checkpointing of `checkpointing`) that `config` and `batch_size` allow, in
    lexicographic (dp, pp, tp, cp) order. microbatches: a number, or None for
    `default_microbatches` (pp where it divides)."""
    config = GPTConfig() if config is None else config
    out = []
    for dp, pp, tp, cp in factorizations(workers):
        m = default_microbatches(batch_size, dp, pp) if microbatches is None else microbatches
        for zero in zero_stages:
            for ckpt in checkpointing:
                lay = Layout(dp, pp, tp, cp, zero, ckpt, m, schedule)
                if not lay.problems(config, workers, batch_size):
                    out.append(lay)
    return out
