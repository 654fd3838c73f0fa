"""Run a pipeline schedule (`ddnb.pipeline_parallel.schedules`) on the stages of a real
pipeline: each rank walks its own action list, F(j), B(j) and W(j) on its `PipelineStage`s.

    schedule = get_schedule("1f1b", p, m)          # any: gpipe, interleaved, zbh1, zbv, dualpipev
    stages = build_stages(model, schedule, m, (B, T))   # this rank's, one per chunk, placed as
                                                        # the schedule says (looped or V)
    result = run_schedule(stages, schedule, inputs=idx, targets=targets, loss_fn=lm_loss)
    result.loss                  # mean of the m micro-batch losses (last stage), else None
    result.in_flight             # most micro-batches held at once (F until B, or until W)
    result.peak_activation_bytes # the most bytes autograd held for backward at once here
    optimizer.step()             # each stage steps its own parameters

A single stage (`PipelineStage(model, m, (B, T))`, one chunk, looped placement) can be
passed alone. The gradients are those of the mean loss over the micro-batches,
(1/m) Σ_j ∇ loss(model(x_j), y_j), summed in .grad across the backwards of the step
(GPipe's synchronous update, Huang et al. 2019, Sec. 2.2) — the same gradient as one
process running the unsplit model on the whole batch with that loss, whatever the
schedule. Where the schedule has W actions, B(j) computes only the gradient of the
stage's input (what the previous stage waits for) and W(j) the weights' gradients
(Qi et al. 2024, "Zero Bubble Pipeline Parallelism", Sec. 2;
`ddnb.pipeline_parallel.split_backward`); a micro-batch is then held from F until W.
Consecutive virtual stages on this rank (the V's turn of ZB-V and DualPipeV) hand the
activation and its gradient over in memory, without a message.

Every F, B and W is traced as a "compute" event (name "F3", with op, microbatch, chunk
and virtual stage), every message as "send"/"recv", in the stage's tracer (`ddnb.trace`).
While an action computes, the receive the next one needs is already posted (the send
of this action's output travels in the same batch_isend_irecv). Activation memory is
measured with `ddnb.memory.SavedActivations` (what autograd saves for backward, counted
when saved and uncounted when the backward frees it).
Taught in `notebooks/09_pipeline_parallelism.ipynb`.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ddnb.emulate.clock import stamp   # time.time(), or the emulated time in an emulated cluster
from ddnb.pipeline_parallel.schedules import BACKWARD, FORWARD, WEIGHT, Action, placement_of, validate_schedule
from ddnb.trace import get_tracer

if TYPE_CHECKING:
    from ddnb.pipeline_parallel.stage import PipelineStage


@dataclass
class StepResult:
    """What one rank saw in one pipeline step."""

    loss: float | None                    # mean micro-batch loss, on the last stage only
    peak_activation_bytes: int | None     # None unless measured
    in_flight: int                        # most (micro-batch, chunk) pairs held: F until B, or until W if split
    live_bytes: list = field(default_factory=list)   # bytes held after each action (if measured)


def split_microbatches(t: torch.Tensor | None, microbatches: int) -> list:
    """[t_0, ..., t_{m-1}]: contiguous chunks of the batch dimension (torch.tensor_split,
    as torch.distributed.pipelining splits), each copied into its own storage as a data
    loader would deliver it (a view would keep, and count, the whole batch), or m Nones."""
    return [None] * microbatches if t is None else [c.clone() for c in torch.tensor_split(t, microbatches, dim=0)]


def run_schedule(stage: PipelineStage | list[PipelineStage], schedule, inputs: torch.Tensor | None = None,
                 targets: torch.Tensor | None = None, loss_fn=None, measure_memory: bool = False,
                 step: int = 0) -> StepResult:
    """Run this rank's actions of `schedule` (a list per rank, or this rank's list) for one
    step on `stage` (a PipelineStage, or the list of this rank's stages, one per chunk:
    `build_stages`). The virtual stage that provides the first layer needs `inputs` (the
    whole batch), the one with the last layer `targets` and `loss_fn(output, target)`.
    Everything is checked before the first message."""
    stages = list(stage) if isinstance(stage, (list, tuple)) else [stage]
    actions = _check(stages, schedule, inputs, targets, loss_fn)
    m, tr = stages[0].microbatches, get_tracer(stages[0].tracer)
    xs, ys = split_microbatches(inputs, m), split_microbatches(targets, m)
    split = any(a.op == WEIGHT for a in actions)
    for st in stages:
        st.reset(split=split)
    local: dict[tuple[str, int, int], torch.Tensor] = {}   # (op, mb, virtual stage) -> handed over in memory
    meter = _meter(measure_memory)
    live_bytes, most = [], 0
    with meter as mem:
        for i, a in enumerate(actions):
            st = stages[a.chunk]
            key = (a.op, a.microbatch, st.stage_index)
            received = (local.pop(key) if key in local else
                        st.receive(a.op, a.microbatch) if st.needs_recv(a.op, a.microbatch) else None)  # not compute
            start = stamp()
            out = None
            if a.op == FORWARD:
                out = st.forward(a.microbatch, xs[a.microbatch] if st.is_first else received, ys[a.microbatch],
                                 loss_fn)
            elif a.op == BACKWARD:
                out = st.backward(a.microbatch, received)
            else:
                st.backward_weight(a.microbatch)
            most = max(most, sum(s.held for s in stages))
            live = mem.live if mem is not None else None
            tr.record("compute", repr(a), start, stamp(), op=a.op, microbatch=a.microbatch, chunk=a.chunk,
                      stage=st.stage_index, step=step, live_bytes=live)
            if mem is not None:
                live_bytes.append(live)
            send = None
            if out is not None and st.destination(a.op) == st.rank:      # the V's turn: no message
                local[(a.op, a.microbatch, st.stage_index + (1 if a.op == FORWARD else -1))] = out
            elif out is not None:
                send = (a.op, a.microbatch, out)
            nxt = actions[i + 1] if i + 1 < len(actions) else None
            nst = stages[nxt.chunk] if nxt is not None else st
            recv = (nxt.op, nxt.microbatch) if nxt is not None and nst.needs_recv(nxt.op, nxt.microbatch) else None
            st.communicate(send, recv, recv_stage=nst)
        for st in stages:
            st.flush()
    last = [st for st in stages if st.is_last]
    loss = float(sum(v.detach() for v in last[0].losses.values())) if last else None
    for st in last:
        st.losses.clear()
    return StepResult(loss=loss, peak_activation_bytes=mem.peak if mem is not None else None,
                      in_flight=most, live_bytes=live_bytes)


def _meter(measure: bool):
    if not measure:
        return contextlib.nullcontext(None)
    from ddnb.memory import SavedActivations

    return SavedActivations()


def _check(stages, schedule, inputs, targets, loss_fn) -> list[Action]:
    """This rank's actions, after checking every argument (ValueError before any message)."""
    first = stages[0]
    m, rank, world_size = first.microbatches, first.rank, first.world_size
    problems = []
    if schedule and isinstance(schedule[0], (list, tuple)) and not isinstance(schedule[0], Action):
        if len(schedule) != world_size:
            raise ValueError(f"the schedule has {len(schedule)} ranks, the pipeline has world_size({world_size})")
        validate_schedule(schedule, m)
        actions = list(schedule[rank])
        placement = placement_of(schedule)
        if any(st.placement != placement for st in stages):
            problems.append(f"the schedule places the virtual stages {placement} (placement[rank][chunk]), the "
                            f"stages were built for {first.placement}: build them with "
                            f"build_stages(model, schedule, ...)")
        v = len(placement[rank])
    else:
        actions = list(schedule)
        v = 1 + max((a.chunk for a in actions), default=0)
    if [st.chunk for st in stages] != list(range(v)) or any(st.chunks != v for st in stages):
        problems.append(f"the schedule has {v} chunk(s) per rank; it needs one stage per chunk, in order, "
                        f"built with chunks={v}; got stages of chunks {[st.chunk for st in stages]} "
                        f"(chunks={[st.chunks for st in stages]})")
    if any(st.microbatches != m or st.rank != rank for st in stages):
        problems.append("this rank's stages disagree on microbatches or rank")
    batch = first.microbatch_size * m
    if any(st.is_first for st in stages) and (inputs is None or inputs.shape[0] != batch):
        problems.append(f"stage 0 needs inputs with batch_size({batch}) = microbatches({m}) x "
                        f"{first.microbatch_size} rows, got {None if inputs is None else tuple(inputs.shape)}")
    if any(st.is_last for st in stages) and (targets is None or targets.shape[0] != batch or loss_fn is None):
        problems.append(f"the last stage needs targets with {batch} rows and a loss_fn, got targets "
                        f"{None if targets is None else tuple(targets.shape)} and loss_fn={loss_fn!r}")
    if problems:
        raise ValueError(f"rank {rank}: " + "; ".join(problems))
    return actions
