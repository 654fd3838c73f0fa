"""`plan`: every way to lay a GPT out on N workers, ranked by predicted step time, with the
reason each dropped layout cannot run.

    from ddnb.cost.planner import plan, plan_table
    rows = plan(dict(n_layers=48, d_model=8192, n_heads=64, vocab=51200, seq_len=2048),
                "ib", workers=64, memory_per_worker=80e9, global_batch=512)
    print(plan_table(rows, top=5))          # also: ddnb.plan(...), python -m ddnb.bench plan ...

It enumerates dp × pp × tp × cp = workers (every ordered factorization), ZeRO stages on the
dp·cp ranks, activation checkpointing on and off, micro-batch sizes and model chunks per
pipeline rank, and for each layout either

- a reason it cannot run at all (`ddnb.cost.layout.layout_problems`: "tp 16 > 8 ranks per
  host", "heads 12 % tp 8 != 0", "layers 30 % pp 4 != 0", "batch 512 % (dp 3 x microbatch
  size 1) != 0", ...), or
- its memory per worker (`layout_memory`, chapter 11's formulas) and predicted step time
  with its parts (`layout_step_time`: compute, bubble, tp_comm, cp_comm, pp_comm, dp_comm,
  chapter 12's model on every axis, no overlap), and whether it fits: a layout over
  `memory_per_worker` is dropped with "memory 21.3 GB > 16 GB".

Ranking: the layouts that fit by step time (then memory, then the layout's fields, so that
the order is the same on every run), then those that do not fit by memory, then those that
cannot run, in the order they were enumerated. Expert parallelism (ep) needs a
mixture-of-experts model, which these dense shapes are not: it is not enumerated.
Taught in `notebooks/16_capstone.ipynb`: it ranks what `notebooks/11_memory_sharding.ipynb` and
`notebooks/12_scalability.ipynb` compute one layout at a time.
"""
from __future__ import annotations

from ddnb._checks import Checks
from ddnb.cost.layout import ALLREDUCE, PARTS, Layout, layout_memory, layout_problems, layout_step_time, model_shape
from ddnb.cost.memory_model import OPTIMIZERS, PRECISIONS
from ddnb.cost.zero import STAGES
from ddnb.emulate.profile import get_profile

AXES = ("dp", "pp", "tp", "cp")


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def factorizations(workers: int, axes: int = 4) -> list[tuple[int, ...]]:
    """Every ordered tuple of `axes` positive integers whose product is `workers`, in
    lexicographic order: factorizations(4, 2) == [(1, 4), (2, 2), (4, 1)]."""
    if axes == 1:
        return [(workers,)]
    return [(k,) + rest for k in _divisors(workers) for rest in factorizations(workers // k, axes - 1)]


def layouts(workers: int, zero_stages=STAGES, checkpointing=(False, True), microbatch_sizes=(1, 2, 4, 8),
            chunks=(1,), context_parallel: bool = True) -> list[Layout]:
    """Every Layout of `workers` workers with these options, in a fixed order (cp = 1 only
    when context_parallel is False)."""
    grids = [g for g in factorizations(workers) if context_parallel or g[3] == 1]
    return [Layout(dp, pp, tp, cp, z, c, b, v) for dp, pp, tp, cp in grids for z in zero_stages
            for c in checkpointing for b in microbatch_sizes for v in chunks]


def _options(check: Checks, name: str, values, allowed=None, **bounds) -> None:
    ok = isinstance(values, (list, tuple)) and len(values) > 0
    if allowed is not None:
        ok = ok and all(v in allowed and type(v) is type(allowed[0]) for v in values)
        check.rule(ok, f"{name}={values!r}: need a non-empty list of {list(allowed)}")
    else:
        check.integers(name, values, **bounds)


def plan(model, profile, workers: int, memory_per_worker: float, global_batch: int, *, precision: str = "mixed",
         optimizer: str = "adam", zero_stages=STAGES, checkpointing=(False, True), microbatch_sizes=(1, 2, 4, 8),
         chunks=(1,), context_parallel: bool = True, dropout: bool = True,
         tied_embeddings: bool = True, allreduce: str = "hierarchical") -> list[dict]:
    """Every layout of `model` (a GPTConfig or a dict of n_layers, d_model, n_heads, vocab,
    seq_len) on `workers` workers of `profile` (a ddnb.emulate Profile or its name), each
    with `memory_per_worker` bytes, training `global_batch` sequences a step; ranked as the
    module docstring says. One dict a layout: "layout" (its description), dp, pp, tp, cp,
    zero, checkpointing, microbatch_size, microbatches, chunks, "memory" (bytes on the
    fullest worker, None if it cannot run), "memory_parts", "fits", "step_time" (seconds,
    predicted), "parts" ({compute, bubble, tp_comm, cp_comm, pp_comm, dp_comm}), "reason"
    (None for a layout that fits, else why it was dropped). The profile's peak_flops is
    taken as the rate of `precision` (the named profiles are float32 peaks). `allreduce`:
    how the data-parallel collectives cross hosts ("hierarchical", NCCL's two levels, or
    "ring", one flat ring: ddnb's, which the emulated cluster runs)."""
    with Checks("plan") as check:
        try:
            shape = model_shape(model)
        except ValueError as e:
            check.rule(False, str(e))
        try:
            prof = get_profile(profile)
        except (ValueError, TypeError, KeyError) as e:
            check.rule(False, f"profile={profile!r}: {e}")
        check.integer("workers", workers, min=1)
        check.number("memory_per_worker", memory_per_worker, positive=True, why=" (bytes)")
        check.integer("global_batch", global_batch, min=1)
        check.choice("precision", precision, PRECISIONS)
        check.choice("optimizer", optimizer, OPTIMIZERS)
        check.choice("allreduce", allreduce, ALLREDUCE)
        _options(check, "zero_stages", zero_stages, allowed=STAGES)
        _options(check, "checkpointing", checkpointing, allowed=(False, True))
        _options(check, "microbatch_sizes", microbatch_sizes, min=1)
        _options(check, "chunks", chunks, min=1)
        for name, flag in (("context_parallel", context_parallel), ("dropout", dropout),
                           ("tied_embeddings", tied_embeddings)):
            check.rule(isinstance(flag, bool), f"{name}={flag!r}: need True or False")
    fits, too_big, cannot = [], [], []
    for lay in layouts(workers, tuple(dict.fromkeys(zero_stages)), tuple(dict.fromkeys(checkpointing)),
                       tuple(dict.fromkeys(microbatch_sizes)), tuple(dict.fromkeys(chunks)), context_parallel):
        row = {"layout": str(lay), **{a: getattr(lay, a) for a in AXES}, "zero": lay.zero,
               "checkpointing": lay.checkpointing, "microbatch_size": lay.microbatch_size, "microbatches": None,
               "chunks": lay.chunks, "memory": None, "memory_parts": None, "fits": False, "step_time": None,
               "parts": None, "reason": None}
        problems = layout_problems(shape, lay, global_batch, prof.ranks_per_host)
        if lay.zero and lay.dp * lay.cp == 1:
            problems.append(f"zero {lay.zero} with dp x cp = 1 shards nothing (the same layout as zero 0)")
        if lay.chunks > 1 and lay.pp == 1:
            problems.append(f"chunks {lay.chunks} with pp 1: nothing to interleave (the same layout as chunks 1)")
        if problems:
            row["reason"] = "; ".join(problems)
            cannot.append(row)
            continue
        memory = layout_memory(shape, lay, global_batch, precision, optimizer, dropout, tied_embeddings)
        time = layout_step_time(shape, lay, prof, global_batch, precision, optimizer, tied_embeddings, allreduce)
        row.update(microbatches=lay.microbatches(global_batch), memory=memory["total"], memory_parts=memory,
                   step_time=time["step_time"], parts={k: time[k] for k in PARTS})
        if memory["total"] <= memory_per_worker:
            row["fits"] = True
            fits.append(row)
        else:
            row["reason"] = f"memory {_gb(memory['total'], memory_per_worker)} > {memory_per_worker / 1e9:g} GB"
            too_big.append(row)
    fields = lambda r: tuple(r[k] for k in AXES + ("zero", "checkpointing", "microbatch_size", "chunks"))  # noqa: E731
    fits.sort(key=lambda r: (r["step_time"], r["memory"], fields(r)))
    too_big.sort(key=lambda r: (r["memory"], r["step_time"], fields(r)))
    return fits + too_big + cannot


def _gb(nbytes: float, budget: float) -> str:
    """nbytes in GB to 3 significant digits, or as many more as it takes not to print the
    budget itself (80.04 GB against 80 GB)."""
    for digits in range(3, 10):
        text = f"{nbytes / 1e9:.{digits}g}"
        if text != f"{budget / 1e9:g}":
            break
    return f"{text} GB"


def plan_table(rows: list[dict], top: int | None = 10, dropped: int = 5) -> str:
    """The first `top` layouts that fit (all with None), then the first `dropped` dropped ones
    with their reasons, as text."""
    ok = [r for r in rows if r["fits"]][:top]
    lines = [f"{'layout':<58} {'memory GB':>9} {'step s':>9}  " + " ".join(f"{p:>8}" for p in PARTS)]
    for r in ok:
        lines.append(f"{r['layout']:<58} {r['memory'] / 1e9:>9.3g} {r['step_time']:>9.3g}  "
                     + " ".join(f"{r['parts'][p]:>8.3g}" for p in PARTS))
    rest = [r for r in rows if not r["fits"]]
    if rest:
        lines.append(f"dropped: {len(rest)} of {len(rows)} layouts, e.g.")
        lines += [f"  {r['layout']}: {r['reason']}" for r in rest[:dropped]]
    return "\n".join(lines)


def best(rows: list[dict]) -> dict | None:
    """The fastest layout that fits, or None when none does."""
    return next((r for r in rows if r["fits"]), None)
