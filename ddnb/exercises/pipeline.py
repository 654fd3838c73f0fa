"""Checker for the pipeline chapter (09): the learner's 1F1B schedule, as action lists,
validated and then run on real processes through ddnb's executor, its gradients against
one process's. Taught in `notebooks/09_pipeline_parallelism.ipynb`.
"""
from __future__ import annotations

from ddnb._checks import Checks
from ddnb.exercises.core import passed, run_on_ranks
from ddnb.pipeline_parallel.schedules import FORWARD, Action, in_flight, validate_schedule


def _as_actions(schedule) -> list[list[Action]]:
    """Accept Actions or strings such as "F3" / "B0"."""
    out = []
    for acts in schedule:
        row = []
        for a in acts:
            if isinstance(a, str):
                a = Action(a[0], int(a[1:]))
            row.append(Action(*a))
        out.append(row)
    return out


def _run_pipeline(schedule, microbatches: int):
    import torch.distributed as dist

    from ddnb.models import GPTConfig, gpt, lm_loss, synthetic_task
    from ddnb.pipeline_parallel import PipelineStage, reference_grads, run_schedule

    cfg = GPTConfig(vocab_size=16, seq_len=8, d_model=16, n_heads=2, n_layers=2)
    idx, targets = synthetic_task(cfg, batch_size=2 * microbatches, steps=1, seed=0)[0]
    model = gpt(cfg, seed=0)
    stage = PipelineStage(model, microbatches, idx.shape)
    run_schedule(stage, schedule, idx, targets, lm_loss)
    _, ref = reference_grads(gpt(cfg, seed=0), idx, targets, lm_loss, microbatches)
    layer_of = [int(n.split(".")[0]) for n, _ in model.named_parameters()]
    ref = [g for g, layer in zip(ref, layer_of) if stage.start <= layer < stage.end]
    mine = [q.grad for q in stage.module.parameters()]
    return dist.get_rank(), max((a - b).abs().max().item() for a, b in zip(mine, ref))


def check_1f1b(schedule_fn, stages: int = 4, microbatches: int = 6, timeout: float = 60) -> str:
    """`schedule_fn(stages, microbatches)` returns one action list per rank ("F3", "B0" or
    Actions). Checked in order: it is a valid schedule (every micro-batch once forward and
    once backward, no deadlock); every stage s holds at most stages - s micro-batches'
    activations (1F1B's bound, where GPipe holds all m); it runs on `stages` real
    processes through ddnb's executor and gives one process's gradients (1e-5)."""
    with Checks("check_1f1b") as check:
        check.rule(callable(schedule_fn), f"schedule_fn={schedule_fn!r}: need a function (stages, microbatches)")
        check.integer("stages", stages, min=2, max=8)
        check.integer("microbatches", microbatches, min=1)
    schedule = _as_actions(schedule_fn(stages, microbatches))
    if len(schedule) != stages:
        raise AssertionError(f"expected one action list per stage ({stages}), got {len(schedule)}")
    try:
        validate_schedule(schedule, microbatches)
    except ValueError as e:
        raise AssertionError(f"{e}. Hint: a stage can run B(j) only after the next stage's B(j), "
                             f"and F(j) only after the previous stage's F(j)") from None
    for s, acts in enumerate(schedule):
        held, bound = in_flight(acts), min(stages - s, microbatches)
        if held > bound:
            first_b = next(i for i, a in enumerate(acts) if a.op != FORWARD)
            raise AssertionError(
                f"stage {s} holds the activations of {held} micro-batches at once, 1F1B holds at most "
                f"{bound}: it runs {first_b} forwards before its first backward; warm up with "
                f"stages - s - 1 = {stages - s - 1} forwards, then alternate one forward, one backward")
    errors = run_on_ranks(_run_pipeline, stages, schedule, microbatches, what="your schedule", timeout=timeout)
    worst = max(e for _, e in errors)
    if worst > 1e-5:
        raise AssertionError(f"gradients differ from one process by {worst:.2e} on rank "
                             f"{max(errors, key=lambda x: x[1])[0]}")
    return passed("check_1f1b", f"valid, at most stages - s micro-batches in flight, gradients equal to one "
                                f"process on {stages} processes ({microbatches} micro-batches)")
