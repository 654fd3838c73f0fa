"""Checker for the pipeline chapter's executor loop (09): the learner's loop that runs one
rank's action list of a schedule given as data (`ddnb.pipeline_parallel.schedules`),

    F(j): x = micro-batch j (stage 0) or the activation received from rank - 1;
          y = stage(x); send y to rank + 1, or on the last stage L_j = loss(y, t_j) / m
    B(j): back-propagate L_j (last stage) or y_j with dL/dy_j received from rank + 1,
          then send dL/dx_j to rank - 1 (but on stage 0)

(GPipe, Huang et al. 2019, Sec. 2.2; 1F1B, Narayanan et al. 2021, Sec. 2.2.1). Run on real
processes with ddnb's GPipe and 1F1B schedules, it must give every stage the gradients of
one process on the whole batch with the mean micro-batch loss (1/m) sum_j loss_j (1e-5),
never deadlock, and hold at most as many micro-batches' activations as the schedule does
(`in_flight`: m under GPipe, p - r under 1F1B), measured as the bytes autograd saves for
backward (`ddnb.memory.SavedActivations`) in units of one micro-batch's.
Taught in `notebooks/09_pipeline_parallelism.ipynb`.

    check_pipeline_loop(my_run_actions)   # my_run_actions(stage, actions, inputs, targets, loss_fn)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ddnb._checks import Checks
from ddnb.exercises.core import passed, run_on_ranks, used_name
from ddnb.models import GPTConfig

SHORTCUTS = ("run_schedule",)     # ddnb's executor: the answer to this exercise
CFG = GPTConfig(vocab_size=16, seq_len=8, d_model=16, n_heads=2, n_layers=2)   # 4 layers: one per stage
MICROBATCH_SIZE = 2
CASES = ((4, "gpipe", 4), (4, "1f1b", 6), (3, "1f1b", 4))   # (stages, schedule, micro-batches)


@dataclass
class LoopStage:
    """What the learner's loop gets for this rank: `module`, its layers (an nn.Sequential
    slice of the GPT); `prev` / `next`, the neighbour ranks (None on the first / last
    stage); `shape`, the shape of every message, an activation or its gradient (float32)."""

    module: nn.Module
    prev: int | None
    next: int | None
    shape: tuple


def _unit_bytes(module, x, target, loss_fn, m: int, first: bool, last: bool) -> int:
    """Bytes autograd saves for one micro-batch's forward on this stage (received input,
    a leaf that requires grad, included), the unit of the peak check."""
    from ddnb.memory import SavedActivations

    x = x if first else x.clone().requires_grad_()
    with SavedActivations() as mem:
        y = module(x)
        if last:
            y = loss_fn(y, target) / m
        live = mem.live
    del y
    return live


def _run(fn, schedule_name: str, microbatches: int):
    """On each rank: build this rank's stage of the GPT, run fn on its actions inside
    SavedActivations, and return (rank, largest gradient difference from one process,
    <mine, ref> / <ref, ref>, parameters left without a gradient, peak, unit, bound)."""
    import torch.distributed as dist

    from ddnb.memory import SavedActivations
    from ddnb.models import gpt, lm_loss, synthetic_task
    from ddnb.pipeline_parallel import get_schedule, in_flight, partition_layers, reference_grads, split_microbatches

    rank, p, m = dist.get_rank(), dist.get_world_size(), microbatches
    idx, targets = synthetic_task(CFG, batch_size=MICROBATCH_SIZE * m, steps=1, seed=0)[0]
    model = gpt(CFG, seed=0)
    start, end = partition_layers(len(model), p)[rank]
    module = model[start:end]
    x0, t0 = idx[:MICROBATCH_SIZE].clone(), targets[:MICROBATCH_SIZE].clone()   # own storages, as the inputs'
    with torch.no_grad():
        shape = tuple(model[0](x0).shape)                      # (b, T, d): every boundary of the GPT
        x0 = model[:start](x0)                                 # what this stage receives, micro-batch 0
    unit = _unit_bytes(module, x0, t0, lm_loss, m, rank == 0, rank == p - 1)
    actions = get_schedule(schedule_name, p, m)[rank]
    stage = LoopStage(module, rank - 1 if rank else None, rank + 1 if rank < p - 1 else None, shape)
    xs, ys = split_microbatches(idx, m), split_microbatches(targets, m)
    with SavedActivations() as mem:
        fn(stage, list(actions), xs, ys, lm_loss)
    dist.barrier()                                               # every message of the step has arrived
    _, ref = reference_grads(gpt(CFG, seed=0), idx, targets, lm_loss, m)
    layer_of = [int(n.split(".")[0]) for n, _ in model.named_parameters()]
    ref = [g for g, layer in zip(ref, layer_of) if start <= layer < end]
    mine = [q.grad for q in module.parameters()]
    missing = sum(g is None for g in mine)
    mine = [torch.zeros_like(r) if g is None else g for g, r in zip(mine, ref)]
    err = max((a - b).abs().max().item() for a, b in zip(mine, ref))
    dot = sum((a * b).sum().item() for a, b in zip(mine, ref)) / max(sum((b * b).sum().item() for b in ref), 1e-30)
    return rank, err, dot, missing, mem.peak, unit, in_flight(actions)


DEADLOCK_HINT = ("In a pipeline: every F(j) but the last stage's sends its output to next and every B(j) but "
                 "stage 0's sends its input's gradient to prev, in the order of the actions; a blocking dist.send "
                 "waits for its receive, and in 1F1B's steady state rank r sends an activation while rank r + 1 "
                 "sends a gradient, neither receiving. Send with dist.isend, receive with dist.recv, and wait for "
                 "every isend before returning")


def _hint_for_error(msg: str) -> str:
    if "NoneType" in msg:
        return (" Hint: a received activation must be a leaf that requires grad (x.requires_grad_()) before "
                "the forward, so that backward fills x.grad, the gradient to send to prev")
    return ""


def check_pipeline_loop(fn, cases=CASES, timeout: float = 20) -> str:
    """Run `fn(stage, actions, inputs, targets, loss_fn)` on real processes for each
    (stages, schedule, micro-batches) of `cases` (default: 4 stages GPipe m=4 and 1F1B
    m=6, 3 stages 1F1B m=4). `stage` is a `LoopStage` (module, prev, next, shape),
    `actions` this rank's list of Action(op, microbatch), `inputs` / `targets` the m
    micro-batches (every rank gets them; stage 0 uses inputs, the last stage targets),
    `loss_fn(output, target)`. Checked on every rank: it finishes within `timeout` (else
    the deadlock is named); its stage's gradients equal one process's (1e-5); its peak of
    saved activations is at most the schedule's micro-batches in flight. ddnb's
    `run_schedule` is refused."""
    with Checks("check_pipeline_loop") as check:
        check.rule(callable(fn), f"fn={fn!r}: need a function fn(stage, actions, inputs, targets, loss_fn)")
        check.rule(isinstance(cases, (list, tuple)) and len(cases) > 0, f"cases={cases!r}: need a non-empty list")
        for i, case in enumerate(cases or ()):
            ok = (isinstance(case, (list, tuple)) and len(case) == 3 and case[1] in ("gpipe", "1f1b")
                  and all(isinstance(v, int) and not isinstance(v, bool) for v in (case[0], case[2]))
                  and 2 <= case[0] <= 4 and case[2] >= 1)
            check.rule(ok, f"cases[{i}]={case!r}: need (stages 2..4, 'gpipe' or '1f1b', microbatches >= 1)")
    used = used_name(fn, SHORTCUTS)
    if used:
        raise AssertionError(f"{getattr(fn, '__name__', 'fn')} calls {used}, ddnb's executor: write the loop "
                             f"over the actions yourself, that is the exercise")
    for stages, name, m in cases:
        label = f"{'GPipe' if name == 'gpipe' else '1F1B'}, {stages} stages, m = {m}"
        try:
            rows = run_on_ranks(_run, stages, fn, name, m, what=f"your loop ({label})", timeout=timeout)
        except AssertionError as e:
            text = str(e)
            extra = f" {DEADLOCK_HINT}" if "did not finish" in text else _hint_for_error(text)
            raise AssertionError(text + extra) from None
        for rank, err, dot, missing, peak, unit, bound in rows:
            if missing:
                raise AssertionError(f"{label}: rank {rank}: {missing} parameter(s) of its stage have no gradient: "
                                     f"B(j) must back-propagate micro-batch j through the stage")
            if err > 1e-5:
                ratio = (f" Your gradients are {dot:.2f} x one process's: the step's loss is the mean over the "
                         f"micro-batches, so the last stage back-propagates loss_fn(y, t) / m"
                         if abs(dot - m) < 0.05 * m else
                         " Hint: B(j) back-propagates micro-batch j's own output with the gradient received for j")
                raise AssertionError(f"{label}: rank {rank}'s gradients differ from one process by {err:.2e}.{ratio}")
        for rank, err, dot, missing, peak, unit, bound in rows:
            held = peak / unit
            if held > bound + 0.5:
                raise AssertionError(
                    f"{label}: rank {rank} held the activations of {held:.1f} micro-batches at once (peak {peak} "
                    f"saved bytes, one micro-batch {unit}); the schedule holds at most {bound}. Run the actions in "
                    f"the order given: each B(j) frees micro-batch j")
    done = "; ".join(f"{'GPipe' if n == 'gpipe' else '1F1B'} {s} stages m={m}" for s, n, m in cases)
    return passed("check_pipeline_loop", f"gradients equal to one process, no deadlock, saved activations within "
                                         f"the schedule's micro-batches in flight ({done})")
