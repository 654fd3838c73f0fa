"""Activation checkpointing: keep only each block's input, recompute the rest in backward.

ZeRO shards the model states; the other big consumer is the activations autograd keeps
for backward, which grow with batch size, sequence length and depth. Chen et al. 2016
("Training Deep Nets with Sublinear Memory Cost", Sec. 3-4) trade compute for them: run a
segment's forward without saving its intermediates, keep its input (a "checkpoint"), and
rerun that forward inside backward when its gradients are needed. With one checkpoint per
Transformer block, L blocks keep L block inputs (B·T·d each) instead of all their
intermediates, at the price of one more forward of every block (about a third more
compute: backward costs about twice a forward). ZeRO-R's P_a partitions these checkpoints
across model-parallel ranks too (Rajbhandari et al. 2020, Sec. 6.1).

`torch.utils.checkpoint.checkpoint(fn, x, use_reentrant=False)` does it for one call;
`checkpoint_blocks(model)` applies it to every `ddnb.models.Block` of a GPT, and
`activation_cost` measures the bytes forward keeps (`ddnb.memory.SavedActivations`,
which sees the block inputs the checkpoint saves; the recomputed activations live only
while their block's backward runs, one block at a time) and the time of forward+backward.
Taught in `notebooks/11_memory_sharding.ipynb`.
"""
from __future__ import annotations

import time

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ddnb._checks import check_positive_ints
from ddnb.memory import SavedActivations
from ddnb.models import Block, GPTConfig, gpt, lm_loss, synthetic_task


class Checkpointed(nn.Module):
    """`module` whose forward keeps only its input for backward and is recomputed there."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.module, x, use_reentrant=False)


def checkpoint_blocks(model: nn.Sequential) -> nn.Sequential:
    """A Sequential with the same layers (the same parameters, shared) in which every
    Transformer `Block` is `Checkpointed`."""
    if not any(isinstance(m, Block) for m in model):
        raise ValueError(f"checkpoint_blocks needs a Sequential with ddnb.models.Block layers, got "
                         f"{[type(m).__name__ for m in model]}")
    return nn.Sequential(*[Checkpointed(m) if isinstance(m, Block) else m for m in model])


def activation_cost(config: GPTConfig | None = None, batch_size: int = 16, checkpointed: bool = False,
                    repeats: int = 3, seed: int = 0) -> dict:
    """One GPT forward+backward on a batch, with or without a checkpoint per block.
    Returns {"activations": peak bytes saved for backward, "seconds": the fastest of
    `repeats` forward+backward times, "loss", "grads": the parameters' gradients (flat)}."""
    config = GPTConfig() if config is None else config
    check_positive_ints("activation_cost", batch_size=batch_size, repeats=repeats)
    model = gpt(config, seed=seed)
    run = checkpoint_blocks(model) if checkpointed else model
    idx, targets = synthetic_task(config, batch_size, steps=1, seed=seed)[0]          # (B, T) each
    best, peak = float("inf"), 0
    for _ in range(repeats):
        model.zero_grad(set_to_none=True)
        with SavedActivations() as act:
            start = time.perf_counter()
            loss = lm_loss(run(idx), targets)
            loss.backward()
            best = min(best, time.perf_counter() - start)
        peak = act.peak
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    return {"activations": peak, "seconds": best, "loss": loss.item(), "grads": grads}
