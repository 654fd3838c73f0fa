"""The pipeline bubble, measured: `python -m ddnb.bench pipeline --stages 4 --microbatches 1,2,4,8`,
or every schedule on an emulated cluster:
`python -m ddnb.bench pipeline --schedules gpipe,1f1b,interleaved,zbh1,zbv,dualpipev --emulate ib --json`.

A model of equal stages (`layers_per_stage` Linear(width, width) + ReLU blocks per rank,
cut into v chunks of layers_per_stage / v where a schedule has v chunks per rank, at
least one each; an MSE loss on the last) runs two steps of each schedule on `stages`
processes, every F, B and W traced (`ddnb.pipeline_parallel.run_schedule`); the ranks'
clocks are aligned by a barrier before each step, and the last step is measured. A row
holds, for one (schedule, m):

    bubble            measured: `bubble_fraction` of every rank's traced compute events
                      (1 - busy / span, averaged over ranks)
    analytic          what it should be on paper, `analytic_from` says whence:
                      "formula" (p-1)/(m+p-1) for GPipe and 1F1B (Huang et al. 2019,
                      Sec. 2.2), (p-1)/(v m+p-1) for interleaved 1F1B with v chunks
                      (Narayanan et al. 2021, Sec. 2.2.2), (p-1)(T_F+T_B-T_W) / (m(T_F+T_B+T_W)
                      + (p-1)(T_F+T_B-T_W)) with T_F = T_B = T_W for ZB-H1 (Qi et al. 2024,
                      "Zero Bubble Pipeline Parallelism", Sec. 2.3, Table 2;
                      `ddnb.cost.zbh1_bubble_fraction`); "checker" for ZB-V, DualPipeV and
                      a schedule of your own: the unit-cost bubble of
                      `ddnb.pipeline_parallel.validate_schedule` (F = B = W = 1), since the
                      paper's ZB-V bubble is 0 and DualPipeV's formula (DeepSeek-V3 report,
                      Sec. 3.2.1) prices overlapped F&B pairs that run one after the other here
    peak_activations  measured: the most (micro-batch, chunk) pairs a rank held at once,
                      `StepResult.in_flight`, max over ranks (F until B, until W if split)
    step_time         the step's span, first compute event to last over all ranks, in
                      seconds (emulated seconds of the profile when emulated)

In real mode on a laptop the stages share a few cores, so the measured bubble holds the
wait for a core too (`notebooks/09_pipeline_parallelism.ipynb` shows it). In an emulated
cluster (`--emulate PROFILE`) each stage computes on a device of its own in emulated time
and messages take their link's time, so the measured bubble can approach the formula:
what is left is the messages' time and the last stage's loss. Taught in
`notebooks/09_pipeline_parallelism.ipynb` and `notebooks/09b_zero_bubble.ipynb` (which
also runs schedules of its own: `pipeline_benchmark(..., schedules=[("mine", fn)])`).
"""
from __future__ import annotations

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zbh1", "zbv", "dualpipev")
V_SHAPED = ("zbv", "dualpipev")          # two chunks per rank, V placement


def rank_step(plan, microbatches: int, width: int = 1024, microbatch_size: int = 8, layers_per_stage: int = 2,
              steps: int = 2, measure_memory: bool = False) -> dict:
    """On every rank: `steps` steps of the schedule `plan` (a `Schedule`, the same on every
    rank) on p·layers_per_stage layers (more where v chunks per rank need them: at least
    one per virtual stage), each step after a barrier that aligns the ranks' clocks, the
    .grad not zeroed in between: from the second step on every backward (every W, where
    split) adds into an existing .grad, which costs memory traffic, while the first step's
    first backward of each stage only assigns it. Returns the last step's compute events
    of every rank, each rank's `in_flight` and (with `measure_memory`) its
    peak of saved activation bytes, gathered (the same on every rank)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn

    from ddnb.collectives import traced
    from ddnb.emulate import uncounted
    from ddnb.pipeline_parallel import build_stages, num_chunks, run_schedule
    from ddnb.trace import Tracer

    p, v = dist.get_world_size(), num_chunks(plan)
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU())   # the same model for every
                            for _ in range(p * v * max(1, layers_per_stage // v))])  # schedule where v divides it
    batch = microbatch_size * microbatches
    tracer = Tracer()
    stages = build_stages(model, plan, microbatches, (batch, width), input_dtype=torch.float32, tracer=tracer)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(batch, width, generator=g), torch.randn(batch, width, generator=g)
    for _ in range(steps):
        traced.barrier()                    # the ranks start the step together (emulated clocks aligned)
        tracer.clear()
        result = run_schedule(stages, plan, inputs=x, targets=y, loss_fn=F.mse_loss, measure_memory=measure_memory)
    mine = ([dict(e, rank=dist.get_rank()) for e in tracer.take() if e["kind"] == "compute"], result.in_flight,
            result.peak_activation_bytes)
    every = [None] * p
    with uncounted():                       # gathering the results is not part of the schedule
        dist.all_gather_object(every, mine)
    return {"events": [e for evs, _, _ in every for e in evs], "in_flight": [n for _, n, _ in every],
            "peak_bytes": [b for _, _, b in every]}


def _plan(schedule, p: int, m: int, chunks: int):
    """(row name, the Schedule, its analytic bubble, whence) for a name or a (name, fn) pair
    with fn(stages, microbatches) -> a schedule; validated before any process runs it."""
    from ddnb.cost import interleaved_bubble_fraction, pipeline_bubble_fraction, zbh1_bubble_fraction
    from ddnb.pipeline_parallel import Schedule, get_schedule, validate_schedule

    if isinstance(schedule, str):
        name, plan = schedule, get_schedule(schedule, p, m, chunks)
    else:
        name, fn = schedule
        plan = fn(p, m)
        plan = plan if isinstance(plan, Schedule) else Schedule(plan)
    report = validate_schedule(plan, m)
    formula = {"gpipe": lambda: pipeline_bubble_fraction(p, m), "1f1b": lambda: pipeline_bubble_fraction(p, m),
               "interleaved": lambda: interleaved_bubble_fraction(p, m, chunks),
               "zbh1": lambda: zbh1_bubble_fraction(p, m)}
    if isinstance(schedule, str) and schedule in formula:
        return name, plan, formula[schedule](), "formula"
    return name, plan, report.bubble, "checker"


def runnable(name: str, stages: int, microbatches: int) -> str | None:
    """None if schedule `name` takes m micro-batches on p stages, else why not."""
    if name == "interleaved" and microbatches % stages:
        return f"needs m a multiple of stages({stages})"
    if name == "dualpipev" and microbatches < 2 * stages:
        return f"needs m >= 2 x stages({stages})"
    return None


def pipeline_rows(world, microbatches, schedules=("gpipe", "1f1b"), chunks: int = 2, events: bool = False,
                  **model) -> list[dict]:
    """One row per (schedule, m) that the schedule can run (`runnable`): schedule, stages,
    microbatches, chunks, bubble (measured), analytic and analytic_from, error,
    peak_activations, in_flight (per rank), step_time; with `events`, also every rank's
    compute events; with measure_memory=True, peak_bytes (per rank, saved activations).
    `schedules` holds names of SCHEDULES and (name, fn) pairs."""
    from ddnb.pipeline_parallel import bubble_fraction, num_chunks

    rows, p = [], world.n
    for schedule in schedules:
        for m in microbatches:
            if isinstance(schedule, str) and runnable(schedule, p, m):
                continue
            name, plan, analytic, whence = _plan(schedule, p, m, chunks)
            got = world.run(rank_step, plan, m, **model)[0]
            compute = got["events"]
            bubble = bubble_fraction(compute)
            span = max(e["end"] for e in compute) - min(e["start"] for e in compute)
            row = {"schedule": name, "stages": p, "microbatches": m, "chunks": num_chunks(plan), "bubble": bubble,
                   "analytic": analytic, "analytic_from": whence, "error": bubble - analytic,
                   "peak_activations": max(got["in_flight"]), "in_flight": got["in_flight"], "step_time": span}
            if model.get("measure_memory"):
                row["peak_bytes"] = got["peak_bytes"]
            if events:
                row["events"] = compute
            rows.append(row)
    return rows


def pipeline_benchmark(stages: int, microbatches, schedules=("gpipe", "1f1b"), chunks: int = 2, emulate=None,
                       timeout: float = 600, events: bool = False, **model) -> tuple[list[dict], str | None]:
    """`pipeline_rows` in a world of `stages` processes of its own (emulated with a
    profile); returns (rows, the emulation summary or None), each row labelled
    "emulated" with the profile's name (None: real)."""
    from ddnb.emulate import summary
    from ddnb.testing import World

    with World(stages, timeout=timeout, emulate=emulate) as world:
        rows = pipeline_rows(world, microbatches, schedules, chunks, events=events, **model)
        emulation = summary(world.emulation_reports()) if world.emulate else None
        for r in rows:
            r["emulated"] = world.emulate.name if world.emulate else None
    return rows, emulation


def pipeline_table(rows: list[dict]) -> str:
    lines = [f"{'schedule':<14} {'p':>2} {'m':>3} {'v':>2} {'bubble':>7} {'analytic':>8} {'from':>8} {'error':>7} "
             f"{'peak':>4} {'step':>11}"]
    lines += [f"{r['schedule']:<14} {r['stages']:>2} {r['microbatches']:>3} {r['chunks']:>2} {r['bubble']:>7.3f} "
              f"{r['analytic']:>8.3f} {r['analytic_from']:>8} {r['error']:>+7.3f} {r['peak_activations']:>4} "
              f"{r['step_time'] * 1e3:>8.3f} ms" for r in rows]
    return "\n".join(lines)
