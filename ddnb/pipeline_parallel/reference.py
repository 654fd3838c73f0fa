"""What a pipeline step must reproduce, two ways: one process running the unsplit model,
and PyTorch's own pipeline (torch.distributed.pipelining's ScheduleGPipe and
Schedule1F1B) on the same stages.

    grads = reference_grads(model, idx, targets, lm_loss, microbatches=4)   # list per parameter
    got = torch_pipeline_grads(model, "1f1b", idx, targets, lm_loss, microbatches=4)

Both use the loss of `ddnb.pipeline_parallel.executor`: the mean over the m contiguous
micro-batches of loss_fn(model(x_j), y_j) (torch's schedules with scale_grads=True: each
micro-batch's loss back-propagated, then the gradients divided by m).
Taught in `notebooks/09_pipeline_parallelism.ipynb`.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ddnb._checks import Checks
from ddnb.pipeline_parallel.executor import split_microbatches
from ddnb.pipeline_parallel.naive import check_bounds, partition_layers
from ddnb.pipeline_parallel.stage import check_microbatches


def reference_grads(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, loss_fn,
                    microbatches: int = 1) -> tuple[float, list[torch.Tensor]]:
    """(loss, [p.grad for p in model.parameters()]) of one process on the whole batch with
    the loss (1/m) Σ_j loss_fn(model(x_j), y_j); the model's .grad is left untouched."""
    check_microbatches(inputs.shape[0], microbatches)
    params = list(model.parameters())
    xs, ys = split_microbatches(inputs, microbatches), split_microbatches(targets, microbatches)
    loss = sum(loss_fn(model(x), y) for x, y in zip(xs, ys)) / microbatches
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return float(loss.detach()), [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]


def torch_pipeline_grads(model: nn.Sequential, schedule: str, inputs: torch.Tensor | None,
                         targets: torch.Tensor | None, loss_fn, microbatches: int, group=None,
                         boundaries=None, chunks: int = 2) -> tuple[float | None, list[torch.Tensor]]:
    """Run one step of torch.distributed.pipelining on this rank's slice of `model` (a copy:
    `model` is not touched), with `schedule` "gpipe" (ScheduleGPipe), "1f1b"
    (Schedule1F1B), "interleaved" (ScheduleInterleaved1F1B over `chunks` stages per
    rank, virtual stage c·p + rank for chunk c), or on the V placement (virtual stages
    rank and 2p-1-rank, so rank 0 holds the first and the last) "zbv"
    (ScheduleZBVZeroBubble, Qi et al. 2024, Sec. 6) or "dualpipev" (ScheduleDualPipeV,
    DeepSeek-V3 report Sec. 3.2.1). The rank holding stage 0 passes `inputs`, the one
    holding the last stage `targets`. Returns (the mean micro-batch loss on the last
    stage else None, the grads of this rank's parameters, chunk by chunk)."""
    import copy

    from torch.distributed.pipelining import PipelineStage as TorchStage
    from torch.distributed.pipelining import (Schedule1F1B, ScheduleDualPipeV, ScheduleGPipe,
                                              ScheduleInterleaved1F1B, ScheduleZBVZeroBubble)

    kinds = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved": ScheduleInterleaved1F1B,
             "zbv": ScheduleZBVZeroBubble, "dualpipev": ScheduleDualPipeV}
    with Checks("torch_pipeline_grads") as check:
        check.choice("schedule", schedule, kinds)
        check.integer("chunks", chunks, min=1)
        check.integer("microbatches", microbatches, min=1)
    rank, p = dist.get_rank(group), dist.get_world_size(group)
    shaped_v = schedule in ("zbv", "dualpipev")
    v = chunks if schedule == "interleaved" else 2 if shaped_v else 1
    boundaries = partition_layers(len(model), p * v) if boundaries is None else boundaries
    boundaries = check_bounds(boundaries, len(model), p * v)       # p·v (virtual) stages
    held = [rank, 2 * p - 1 - rank] if shaped_v else [c * p + rank for c in range(v)]
    modules, stages = [], []
    for c, s in enumerate(held):
        start, end = boundaries[s]
        module = copy.deepcopy(model[start:end])
        module.zero_grad(set_to_none=True)
        modules.append(module)
        stages.append(TorchStage(module, s, p * v, next(module.parameters()).device, group=group))
    runner = kinds[schedule](stages if v > 1 else stages[0], n_microbatches=microbatches, loss_fn=loss_fn,
                             scale_grads=True)
    first, last = 0 in held, p * v - 1 in held
    if first:
        check_microbatches(inputs.shape[0], microbatches)
    if last:
        check_microbatches(targets.shape[0], microbatches)
    losses: list = []
    # contiguous: torch 2.11's stages check each micro-batch's strides against the ones they
    # inferred (a slice such as tokens[:, :-1] has stride (17, 1), not (16, 1))
    kwargs = {"target": targets.contiguous(), "losses": losses} if last else {}
    runner.step(*((inputs.contiguous(),) if first else ()), **kwargs)
    loss = float(sum(float(x.detach()) for x in losses) / microbatches) if losses else None
    return loss, [torch.zeros_like(q) if q.grad is None else q.grad.detach().clone()
                  for module in modules for q in module.parameters()]
