"""The planner, falsified: `python -m ddnb.bench plan --workers 16 --emulate ib --json` asks
`ddnb.cost.planner.plan` to rank every layout of a small GPT on 16 workers of the profile,
runs the 8 it ranks fastest and 4 it ranks low on the emulated cluster (`ddnb.grid4d.train_4d`,
every axis the package's own code), and sets each measured step beside its prediction.

    rows, summary = plan_check(workers=16, profile="ib")
    rows[0]      # {layout, predicted_step, measured_step, error, predicted_rank, measured_rank, ...}
    summary      # {spearman, spearman_top, layouts, workers, profile, allreduce, slowdown, overruns, ...}

What is compared: the planner's number is chapter 12's model on every axis (compute at the
profile's peak x MFU, the bubble (p - 1)/(m + p - 1), each axis's all-reduce, all-gather or
point-to-point by its alpha-beta formula, no overlap). The measured number is the emulated
cluster's: a virtual clock per rank over real processes exchanging real bytes in their real
order, each message charged alpha + n/B and each op its roofline time (`ddnb.emulate`). The
two share the profile's constants and nothing else, so where they disagree the cause is
something the model leaves out: the memory-bound ops a roofline charges and a FLOP count
does not, the many small messages of tensor and context parallelism (alpha, not n/B), the
optimizer's own traffic, the loss's reductions. The rank correlation (Spearman's rho, ties
given their mean rank; Spearman 1904) says whether the ranking survives them; `spearman_top`
is the same among the top layouts alone, whose predicted steps are close, the harder test.

The model prices the data-parallel collectives as the emulated cluster runs them
(allreduce="ring": one flat ring over the group even across hosts, ddnb's; ZeRO's per unit
and per micro-batch, `ddnb.cost.layout.zero_collectives`); allreduce="hierarchical" asks
whether a model of NCCL's two-level all-reduce would rank this cluster's runs as well.
Each row also carries `textbook_step`, the prediction with ZeRO's traffic priced as one
all-reduce a step and hierarchical across hosts (`ddnb.cost.layout.textbook_dp_comm`, the
planner's first version), and the summary its rank correlation, `spearman_textbook`.

Which layouts run: the plan's rows that `train_4d` can run (`Layout.from_plan`, interleaved
schedules excluded), the first `top` by predicted step and `low` more spread over the
ranking's third quarter. Each runs `steps` steps in one World of `workers` processes; the last
step's time (max over ranks, clocks aligned by a barrier before it) is its measured step.
Taught in `notebooks/16_capstone.ipynb`.
"""
from __future__ import annotations

from ddnb.models import GPTConfig

# small enough for 16 processes on 2 cores, large enough that every axis has work: heads,
# layers, sequence and batch all divide by 2 and 4
CHECK_MODEL = GPTConfig(vocab_size=64, seq_len=16, d_model=64, n_heads=4, n_layers=4)
CHECK_BATCH = 16
PLAN_FIELDS = ("dp", "pp", "tp", "cp", "zero", "checkpointing", "microbatch_size", "chunks")


def ranks_of(values) -> list[float]:
    """1-based ranks of `values` (ascending), ties given the mean of the ranks they span."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(a, b) -> float:
    """Spearman's rank correlation of two equal-length sequences: the Pearson correlation of
    their ranks (Spearman 1904), in [-1, 1]; nan when either is constant."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError(f"spearman: need two sequences of the same length >= 2, got {len(a)} and {len(b)}")
    ra, rb = ranks_of(list(a)), ranks_of(list(b))
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va, vb = sum((x - ma) ** 2 for x in ra), sum((y - mb) ** 2 for y in rb)
    return cov / (va * vb) ** 0.5 if va and vb else float("nan")


def choose(rows: list[dict], config: GPTConfig, workers: int, batch_size: int, top: int = 8,
           low: int = 4) -> list[tuple[int, dict]]:
    """(planner rank, row) of the layouts to run: the first `top` runnable rows that fit, then
    `low` spread evenly over the third quarter of the ranking (below the median; the last
    quarter's steps are up to a hundred times the best's, minutes of real time each at the
    slowdowns 16 processes on 2 cores need)."""
    from ddnb.grid4d import Layout

    ok = []
    for r in rows:
        if not r["fits"] or r["chunks"] != 1:
            continue
        lay = Layout.from_plan(r, batch_size)
        if not lay.problems(config, workers, batch_size):
            ok.append(r)
    ranked = list(enumerate(ok, start=1))
    if len(ranked) <= top + low:
        return ranked
    chosen, n = ranked[:top], len(ranked)
    third = ranked[max(top, n // 2):max(top + low, 3 * n // 4)]
    picks = sorted({round(i * (len(third) - 1) / max(low - 1, 1)) for i in range(low)})
    return chosen + [third[i] for i in picks]


def rank_measure(config: GPTConfig, layouts: list[dict], batch_size: int, steps: int = 2) -> list[float]:
    """On every rank of the world: each layout (a dict of Layout's fields) trained for
    `steps` steps on its ProcessGrid; returns the last step's time per layout, the max over
    ranks (emulated seconds when emulating), the same list on every rank."""
    import torch
    import torch.distributed as dist

    from ddnb.emulate import uncounted
    from ddnb.grid4d import Layout, train_4d
    from ddnb.process_grid import ProcessGrid, reused_group

    times = []
    for fields in layouts:
        lay = Layout(**fields)
        grid = ProcessGrid(dp=lay.dp, pp=lay.pp, tp=lay.tp, cp=lay.cp, new_group=reused_group)
        out = train_4d(grid, config, lay, steps=steps, batch_size=batch_size)
        t = torch.tensor([out["step_times"][-1]], dtype=torch.float64)
        with uncounted():                        # gathering the result is not part of the step
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        times.append(t.item())
    return times


def plan_check(workers: int = 16, profile="ib", top: int = 8, low: int = 4, steps: int = 2,
               config: GPTConfig | None = None, batch_size: int = CHECK_BATCH, timeout: float = 900.0,
               allreduce: str = "ring"):
    """(rows, summary): the chosen layouts, predicted and measured on an emulated `profile`
    (a name or a Profile; a name gets this machine's default slowdown for `workers`) with
    `workers` processes, and {spearman, layouts, workers, profile, slowdown, overruns, ...}."""
    from ddnb._checks import Checks
    from ddnb.cost.layout import Layout as PlanLayout, textbook_dp_comm
    from ddnb.cost.planner import plan
    from ddnb.emulate import get_profile, overruns, summary as emulation_summary
    from ddnb.grid4d import Layout
    from ddnb.runtime.placement import default_slowdown
    from ddnb.testing import World

    config = CHECK_MODEL if config is None else config
    with Checks("plan_check") as check:
        check.integer("workers", workers, min=2)
        check.integer("top", top, min=1)
        check.integer("low", low, min=0)
        check.integer("steps", steps, min=2, why=" (the first step is not measured)")
    prof = get_profile(profile)
    if isinstance(profile, str):
        prof = prof.with_(slowdown=default_slowdown(prof, workers))
    planned = plan(config, prof, workers, memory_per_worker=80e9, global_batch=batch_size, precision="fp32",
                   chunks=(1,), checkpointing=(False,), microbatch_sizes=(1, 2, 4, 8), allreduce=allreduce)
    chosen = choose(planned, config, workers, batch_size, top, low)
    layouts = [vars(Layout.from_plan(r, batch_size)) for _, r in chosen]
    with World(workers, timeout=timeout, emulate=prof) as world:
        measured = world.run(rank_measure, config, layouts, batch_size, steps)[0]
        emulation = emulation_summary(world.emulation_reports())
    order = ranks_of(measured)
    textbook = [r["step_time"] - r["parts"]["dp_comm"] + textbook_dp_comm(
        config, PlanLayout(**{k: r[k] for k in PLAN_FIELDS}), prof, batch_size, precision="fp32") for _, r in chosen]
    rows = []
    for (rank, r), lay, m, mr, t in zip(chosen, layouts, measured, order, textbook):
        rows.append({"layout": r["layout"], "predicted_step": r["step_time"], "measured_step": m,
                     "error": r["step_time"] / m - 1, "predicted_rank": rank, "measured_rank": mr,
                     "parts": r["parts"], "microbatches": lay["microbatches"], "textbook_step": t})
    rho = spearman([r["predicted_step"] for r in rows], measured)
    top_rows = [r for r in rows if r["predicted_rank"] <= top]          # the close contest among the best
    rho_top = spearman([r["predicted_step"] for r in top_rows], [r["measured_step"] for r in top_rows]) \
        if len(top_rows) >= 2 else float("nan")
    summary = {"spearman": rho, "spearman_top": rho_top, "top": len(top_rows),
               "spearman_textbook": spearman(textbook, measured), "layouts": len(rows), "workers": workers,
               "profile": prof.name, "allreduce": allreduce,
               "slowdown": prof.slowdown, "overruns": overruns(emulation), "emulation": emulation}
    return rows, summary


def plan_check_table(rows: list[dict], summary: dict) -> str:
    """The rows as text, with the summary line."""
    lines = [f"{'layout':<58} {'predicted':>10} {'measured':>10} {'error':>7} {'rank p':>6} {'rank m':>6}"]
    for r in rows:
        lines.append(f"{r['layout']:<58} {r['predicted_step'] * 1e3:>8.3f}ms {r['measured_step'] * 1e3:>8.3f}ms "
                     f"{r['error']:>+7.0%} {r['predicted_rank']:>6} {r['measured_rank']:>6g}")
    lines.append(f"Spearman {summary['spearman']:.2f} over {summary['layouts']} layouts of {summary['workers']} "
                 f"workers ({summary['spearman_top']:.2f} among the top {summary['top']}), emulated "
                 f"'{summary['profile']}' at {summary['slowdown']:g}x, {summary['overruns']} overruns")
    return "\n".join(lines)


def rank_grid_check(config: GPTConfig, fields: dict, batch_size: int, steps: int) -> dict:
    """On every rank: one layout (Layout's fields) trained `steps` steps; this rank's losses,
    the bytes of its model states after them ({"parameters", "gradients", "optimizer"}: the
    ZeRO wrapper's `memory()`, or `ddnb.memory.model_memory` of the stage and Adam) and the
    collectives its last step called, by name (traced: tp's, cp's, dp's, ZeRO's)."""
    import torch.distributed as dist

    from ddnb.grid4d import Layout, train_4d
    from ddnb.memory import model_memory
    from ddnb.process_grid import ProcessGrid, reused_group

    from ddnb.trace import Tracer

    lay = Layout(**fields)
    grid = ProcessGrid(dp=lay.dp, pp=lay.pp, tp=lay.tp, cp=lay.cp, new_group=reused_group)
    tracer = Tracer()
    out = train_4d(grid, config, lay, steps=steps, batch_size=batch_size, tracer=tracer)
    opt = out["optimizer"]
    states = opt.memory() if hasattr(opt, "memory") else model_memory(out["stage"].module, opt)
    events = [e for e in tracer.take() if e["kind"] == "collective"]
    last = [e for e in events if e["start"] >= out["step_starts"][-1]]
    return {"rank": dist.get_rank(), "losses": out["losses"], "states": states,
            "collectives": [e["name"] for e in last]}


def grid_check(world, layouts, config: GPTConfig | None = None, batch_size: int = CHECK_BATCH,
               steps: int = 2) -> list[dict]:
    """Each `ddnb.grid4d.Layout` trained on `world` (as many ranks as the layout has) against
    one process on the same global batch: {layout, max_loss_diff, losses, reference,
    measured_states (bytes of model states on the fullest rank), predicted_states (chapter
    11's formula for the layout, `ddnb.cost.layout.layout_memory` in fp32 with Adam, its
    parameters + gradients + optimizer parts), fullest_rank, collectives (rank 0's last
    step, by name)}."""
    from ddnb.cost.layout import Layout as PlanLayout, layout_memory
    from ddnb.grid4d import train_reference

    config = CHECK_MODEL if config is None else config
    reference = train_reference(config, steps=steps, batch_size=batch_size)["losses"]
    rows = []
    for lay in layouts:
        per_rank = world.run(rank_grid_check, config, vars(lay), batch_size, steps)
        fullest = max(per_rank, key=lambda r: sum(r["states"].values()))
        plan_lay = PlanLayout(dp=lay.dp, pp=lay.pp, tp=lay.tp, cp=lay.cp, zero=lay.zero,
                              checkpointing=lay.checkpointing, microbatch_size=batch_size // (lay.dp * lay.microbatches))
        mem = layout_memory(config, plan_lay, batch_size, precision="fp32", tied_embeddings=False)
        rows.append({"layout": str(lay), "losses": per_rank[0]["losses"], "reference": reference,
                     "max_loss_diff": max(abs(a - b) for r in per_rank for a, b in zip(r["losses"], reference)),
                     "measured_states": sum(fullest["states"].values()), "fullest_rank": fullest["rank"],
                     "collectives": per_rank[0]["collectives"],
                     "predicted_states": mem["parameters"] + mem["gradients"] + mem["optimizer"]})
    return rows
