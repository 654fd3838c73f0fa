"""The pipeline bubble, measured: `python -m ddnb.bench pipeline --stages 4 --microbatches 1,2,4,8`.

A model of equal stages (each `layers_per_stage` Linear(width, width) + ReLU blocks, an
MSE loss on the last) runs one step of each schedule on `stages` processes, every F and B
traced (`ddnb.pipeline_parallel.run_schedule`); the bubble is measured from those events
(`bubble_fraction`: 1 - busy / span, averaged over ranks) and set beside GPipe's
(p-1)/(m+p-1) (Huang et al. 2019, Sec. 2.2) or, interleaved with v chunks,
(p-1)/(v m + p-1) (Narayanan et al. 2021, Sec. 2.2.2).

In real mode on a laptop the stages share a few cores, so the measured bubble holds the
wait for a core too (`notebooks/09_pipeline_parallelism.ipynb` shows it). In an emulated
cluster (`--emulate PROFILE`) each stage computes on a device of its own in emulated time
and messages take their link's time, so the measured bubble can approach the formula:
what is left is the messages' time and the last stage's loss. Taught in
`notebooks/09_pipeline_parallelism.ipynb`.
"""
from __future__ import annotations

SCHEDULES = ("gpipe", "1f1b", "interleaved")


def rank_bubble(schedule: str, microbatches: int, chunks: int = 1, width: int = 1024, microbatch_size: int = 8,
                layers_per_stage: int = 2, steps: int = 2) -> float:
    """On every rank: the measured bubble of the last of `steps` steps of `schedule`."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn

    from ddnb.emulate import uncounted
    from ddnb.pipeline_parallel import PipelineStage, bubble_fraction, get_schedule, run_schedule
    from ddnb.trace import Tracer

    p = dist.get_world_size()
    v = chunks if schedule == "interleaved" else 1
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU())
                            for _ in range(layers_per_stage * p * v)])
    batch = microbatch_size * microbatches
    tracer = Tracer()
    stages = [PipelineStage(model, microbatches, (batch, width), input_dtype=torch.float32, tracer=tracer,
                            chunk=c, chunks=v) for c in range(v)]
    plan = get_schedule(schedule, p, microbatches, v)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(batch, width, generator=g), torch.randn(batch, width, generator=g)
    for _ in range(steps):
        tracer.clear()
        run_schedule(stages if v > 1 else stages[0], plan, inputs=x, targets=y, loss_fn=F.mse_loss)
    events = [dict(e, rank=dist.get_rank()) for e in tracer.take() if e["kind"] == "compute"]
    every = [None] * p
    with uncounted():                       # gathering the results is not part of the schedule
        dist.all_gather_object(every, events)
    return bubble_fraction([e for evs in every for e in evs])


def pipeline_rows(world, microbatches, schedules=("gpipe", "1f1b"), chunks: int = 2, **model) -> list[dict]:
    """One row per (schedule, m): schedule, stages, microbatches, chunks, bubble (measured)
    and analytic (the formula)."""
    from ddnb.cost import interleaved_bubble_fraction, pipeline_bubble_fraction

    rows, p = [], world.n
    for name in schedules:
        for m in microbatches:
            v = chunks if name == "interleaved" else 1
            bubble = world.run(rank_bubble, name, m, v, **model)[0]
            analytic = interleaved_bubble_fraction(p, m, v) if v > 1 else pipeline_bubble_fraction(p, m)
            rows.append({"schedule": name, "stages": p, "microbatches": m, "chunks": v, "bubble": bubble,
                         "analytic": analytic, "error": bubble - analytic})
    return rows


def pipeline_benchmark(stages: int, microbatches, schedules=("gpipe", "1f1b"), chunks: int = 2, emulate=None,
                       timeout: float = 600, **model) -> tuple[list[dict], str | None]:
    """`pipeline_rows` in a world of `stages` processes of its own (emulated with a
    profile); returns (rows, the emulation summary or None), each row labelled
    "emulated" with the profile's name (None: real)."""
    from ddnb.emulate import summary
    from ddnb.testing import World

    with World(stages, timeout=timeout, emulate=emulate) as world:
        rows = pipeline_rows(world, microbatches, schedules, chunks, **model)
        emulation = summary(world.emulation_reports()) if world.emulate else None
        for r in rows:
            r["emulated"] = world.emulate.name if world.emulate else None
    return rows, emulation


def pipeline_table(rows: list[dict]) -> str:
    lines = [f"{'schedule':<12} {'p':>2} {'m':>3} {'v':>2} {'bubble':>7} {'analytic':>8} {'error':>7}"]
    lines += [f"{r['schedule']:<12} {r['stages']:>2} {r['microbatches']:>3} {r['chunks']:>2} {r['bubble']:>7.3f} "
              f"{r['analytic']:>8.3f} {r['error']:>+7.3f}" for r in rows]
    return "\n".join(lines)
