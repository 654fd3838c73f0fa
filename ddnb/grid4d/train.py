"""`train_4d`: the small GPT trained on one ProcessGrid with dp × pp × tp × cp at once,
ZeRO 0-3 over the ranks that hold the same parameters and activation checkpointing
optional, each piece the package's own (Narayanan et al. 2021, "Efficient Large-Scale
Language Model Training on GPU Clusters Using Megatron-LM", Sec. 2.3 and 3: the
parallelisms composed on one grid, tp innermost, pp outermost).

    grid = ProcessGrid(dp=2, pp=2, tp=2, cp=2)                # on each of 16 ranks
    lay = Layout(dp=2, pp=2, tp=2, cp=2, zero=1, microbatches=2)
    out = train_4d(grid, config, lay, steps=3, batch_size=8)  # out["losses"]: per step, every rank
    train_reference(config, steps=3, batch_size=8)["losses"]  # one process: the same numbers

Rank (dp, pp, tp, cp) of the grid:
  1. builds gpt(config, seed) (the same on every rank) and keeps its shard of it:
     `TensorParallelGPT.from_module` over the tp group (heads, MLP hidden units and the
     vocabulary split, ddnb.tensor_parallel), the attention of every block replaced by
     causal ring attention over the cp group (`ddnb.context_parallel.ring_attention`,
     K/V blocks around the ring) and the positions embedded from its sequence offset;
     every block optionally `Checkpointed` (ddnb.sharding.activation_checkpointing);
  2. keeps pipeline stage pp of them: n_layers / pp blocks, the embedding on the first
     stage and the head on the last (`PipelineStage`, run by `run_schedule` with 1F1B or
     GPipe over the micro-batches, ddnb.pipeline_parallel);
  3. reads rows dp of the global batch and positions cp of those rows:
     idx[dp rows, cp positions] (B/dp, S/cp);
  4. scores its logit slices with the vocab-parallel cross-entropy summed over its
     positions and divided by the global count of scored targets N (a sequence shard
     may score none: the reversal task ignores the first half), times G = dp·cp, so that
     the mean over the G ranks of its gradients is the global-batch gradient;
  5. averages the gradients over those G ranks (the dp·cp group: same pp and tp
     coordinates, the same parameter shard) and steps Adam: an all-reduce
     (`allreduce_gradients`, zero=0) or ZeRO-1/2/3 over the group (ddnb.sharding,
     Rajbhandari et al. 2020), which reduce-scatter, step a shard and all-gather.
The step's loss is the global batch's lm_loss: one all-reduce over the world sums the
last stage's shares (each of its tp ranks holds the same one), so every rank returns
the same list. Taught in
`notebooks/16_capstone.ipynb` (it combines chapters 09, 10, 11 and 13).
"""
from __future__ import annotations

import functools

import torch
import torch.distributed as dist
from torch import nn

from ddnb.collectives import traced
from ddnb.context_parallel.ring_attention import ring_attention
from ddnb.emulate import uncounted
from ddnb.grid4d.layout import Layout
from ddnb.models import IGNORE, GPTConfig, gpt, synthetic_task
from ddnb.pipeline_parallel.executor import run_schedule
from ddnb.pipeline_parallel.schedules import get_schedule
from ddnb.pipeline_parallel.stage import PipelineStage
from ddnb.sharding.activation_checkpointing import Checkpointed
from ddnb.sharding.zero1 import ZeroStage1
from ddnb.sharding.zero2 import ZeroStage2
from ddnb.sharding.zero3 import ZeroStage3
from ddnb.tensor_parallel.embedding import vocab_parallel_cross_entropy
from ddnb.tensor_parallel.hybrid import _optimizer, allreduce_gradients, train_reference  # noqa: F401 (re-exported)
from ddnb.tensor_parallel.transformer import TensorParallelGPT
from ddnb.trace import Tracer, now

ZERO = {1: ZeroStage1, 2: ZeroStage2, 3: ZeroStage3}


class ShardEmbedding(nn.Module):
    """Token (vocab-parallel) plus position embeddings of a sequence shard that starts at
    position `offset`: idx (B, S/cp) int64 -> (B, S/cp, d)."""

    def __init__(self, tok: nn.Module, pos: nn.Embedding, offset: int):
        super().__init__()
        self.tok, self.pos, self.offset = tok, pos, offset

    def forward(self, idx):                                              # (B, S/cp)
        positions = torch.arange(self.offset, self.offset + idx.shape[1], device=idx.device)
        return self.tok(idx) + self.pos(positions)                       # (B, S/cp, d); g inside tok


class ShardHead(nn.Module):
    """The final LayerNorm and the column-parallel output layer: (B, S/cp, d) -> logit
    slices (B, S/cp, V/tp), never gathered."""

    def __init__(self, ln_f: nn.Module, out: nn.Module):
        super().__init__()
        self.ln_f, self.out = ln_f, out

    def forward(self, x):
        return self.out(self.ln_f(x))


def shard_gpt(grid, config: GPTConfig, layout: Layout, seed: int = 0, tracer: Tracer | None = None) -> nn.Sequential:
    """This rank's tp and cp shard of every layer of gpt(config, seed), as a Sequential
    (ShardEmbedding, block x n_layers, ShardHead) for `PipelineStage` to slice."""
    tp_model = TensorParallelGPT.from_module(gpt(config, seed=seed), grid.group("tp"), tracer)
    blocks = list(tp_model.blocks)
    if layout.cp > 1:
        attend = functools.partial(ring_attention, group=grid.group("cp"), causal=True, check=False, tracer=tracer)
        for block in blocks:
            block.attn.attend = attend                                   # (B, nh/tp, S/cp, hs), the ring over cp
    if layout.checkpointing:
        blocks = [Checkpointed(b) for b in blocks]
    offset = grid.coords().cp * (config.seq_len // layout.cp)
    return nn.Sequential(ShardEmbedding(tp_model.tok, tp_model.pos, offset), *blocks,
                         ShardHead(tp_model.ln_f, tp_model.out))


def stage_boundaries(n_layers: int, pp: int) -> list[tuple[int, int]]:
    """[start, end) of each stage in Sequential(embedding, n_layers blocks, head): n_layers
    / pp blocks each, the embedding with the first and the head with the last."""
    k = n_layers // pp
    return [(0 if s == 0 else 1 + s * k, 1 + (s + 1) * k + (s == pp - 1)) for s in range(pp)]


def train_4d(grid, config: GPTConfig, layout: Layout, steps: int = 3, batch_size: int = 16, lr: float = 1e-2,
             seed: int = 0, optimizer: str = "adam", tracer: Tracer | None = None) -> dict:
    """Train gpt(config, seed) with Adam(lr) on `steps` global batches of the reversal task
    (`synthetic_task(config, batch_size, steps, seed)`, as `train_reference`) laid out as
    `layout` on `grid` (a ProcessGrid with the layout's dp, pp, tp, cp). Call it on every
    rank. optimizer="sgd" (zero 0 only: ddnb's ZeRO steps Adam) makes a wrong gradient
    scale visible, which Adam's g/√v hides. Returns {"losses": the global-batch loss per
    step, the same on every rank, "step_times": this rank's seconds per step, from a
    barrier that aligns the ranks (their emulated clocks, in an emulated cluster) to its
    optimizer step, "step_starts": when each began (`ddnb.trace.now()`), "stage": this rank's PipelineStage, "optimizer": the ZeRO wrapper or
    torch's optimizer}."""
    layout.validate(config, grid.world_size, batch_size)                # before any collective
    if optimizer not in ("adam", "sgd") or (optimizer == "sgd" and layout.zero):
        raise ValueError(f"optimizer={optimizer!r}: need 'adam', or 'sgd' with zero 0 (got zero {layout.zero})")
    sizes = {a: getattr(layout, a) for a in ("dp", "pp", "tp", "cp")}
    if any(grid.sizes[a] != v for a, v in sizes.items()) or grid.ep != 1:
        raise ValueError(f"the grid {grid} is not the layout's {layout}")
    me, m = grid.coords(), layout.microbatches
    grad_group = grid.group_over(("dp", "cp"))                         # same pp, tp: the same parameters
    g = layout.dp * layout.cp
    model = shard_gpt(grid, config, layout, seed, tracer)
    rows, cols = batch_size // layout.dp, config.seq_len // layout.cp  # (B/dp, S/cp) on this rank
    stage = PipelineStage(model, m, (rows, cols), group=grid.group("pp"), tracer=tracer,
                          boundaries=stage_boundaries(config.n_layers, layout.pp),
                          activation=((rows // m, cols, config.d_model), torch.float32))   # (b, S/cp, d)
    schedule = get_schedule(layout.schedule, layout.pp, m)
    if layout.zero:
        opt = ZERO[layout.zero](stage.module, lr=lr, group=grad_group, tracer=tracer)
    else:
        opt = _optimizer(stage.module.parameters(), optimizer, lr)
    tp_group, losses, step_times, step_starts = grid.group("tp"), [], [], []
    for idx, targets in synthetic_task(config, batch_size=batch_size, steps=steps, seed=seed):   # (B, S) each
        scored = int((targets != IGNORE).sum())                          # N: the global batch's
        scale = g * m / scored                                           # PipelineStage divides by m

        def loss_fn(logits, target, scale=scale):                        # (b, S/cp, V/tp), (b, S/cp)
            return vocab_parallel_cross_entropy(logits, target, tp_group, tracer=tracer, reduction="sum") * scale

        mine = (slice(me.dp * rows, (me.dp + 1) * rows), slice(me.cp * cols, (me.cp + 1) * cols))
        traced.barrier()                                                 # the step starts together
        start = now()
        step_starts.append(start)
        opt.zero_grad()
        result = run_schedule(stage, schedule, inputs=idx[mine], targets=targets[mine], loss_fn=loss_fn)
        if layout.zero:
            opt.step()
        else:
            allreduce_gradients(stage.module, grad_group, tracer)       # mean over the dp·cp ranks
            opt.step()
        step_times.append(now() - start)
        total = torch.tensor([result.loss if result.loss is not None else 0.0])
        with uncounted():                     # reporting the loss is not part of the step
            dist.all_reduce(total)            # Σ over the last stage's tp·dp·cp ranks: tp·G x the loss, on all
        losses.append(total.item() / (layout.tp * g))
    return {"losses": losses, "step_times": step_times, "step_starts": step_starts, "stage": stage,
            "optimizer": opt}
