"""ZeRO stage 1 (P_os): every rank keeps Adam's state only for its 1/N of the parameters.

Rajbhandari et al. 2020, "ZeRO", Sec. 5.1: with N data-parallel ranks, rank r updates
only the parameters of its partition, so it needs Adam's momentum and variance (the K·Ψ
of the paper) only for Ψ/N of them; after the step, an all-gather gives every rank the
updated parameters. Per rank: (2 + 2)Ψ + KΨ/N bytes instead of (2 + 2 + K)Ψ.

The step, per unit (layer) u, laid out by `ddnb.sharding.flat.FlatUnit`:

    g_u  = all_reduce(flat grad_u) / N        (N·S,)  every rank: the data-parallel mean
    Adam on shard_u = flat_u[r·S:(r+1)·S]     (S,)    with only this shard's grad and state
    flat_u = all_gather(shard_u from each r)  (N·S,)  every rank: the updated layer

This is the naive form: it all-reduces the *whole* gradient though it uses only 1/N of
it. The paper's point (Sec. 5.2) is that an all-reduce is a reduce-scatter followed by an
all-gather, so stage 2 (`zero2.py`) keeps only the reduce-scatter and the same
communication volume buys a gradient shard instead of a full copy.

fp32 on CPU here (ddnb's clusters are gloo): parameters and gradients take 4 bytes and
Adam's state 8 (K = 8), not the paper's fp16 2 + 2 with fp32 K = 12; `memory()` counts
what this rank really holds. Taught in `notebooks/11_memory_sharding.ipynb`.

    engine = ZeroStage1(model, lr=1e-3)      # model replicated on every rank (same seed)
    loss = lm_loss(engine(idx), targets)     # idx: this rank's part of the batch
    loss.backward()
    engine.step()                            # average grads, Adam on my shard, all-gather
    engine.zero_grad()
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ddnb.memory import tensor_bytes
from ddnb.sharding.flat import FlatUnit, check_units, default_units


def validate_adam(lr, betas, eps) -> None:
    bad = []
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0:
        bad.append(f"lr must be a number > 0, got lr={lr!r}")
    if not (isinstance(betas, (tuple, list)) and len(betas) == 2 and all(0 <= b < 1 for b in betas)):
        bad.append(f"betas must be two numbers in [0, 1), got betas={betas!r}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        bad.append(f"eps must be a number > 0, got eps={eps!r}")
    if bad:
        raise ValueError("; ".join(bad))


def adam_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of Adam's momentum and variance (exp_avg, exp_avg_sq) in `optimizer`: the
    paper's K·Ψ. The step counter (one 4-byte scalar per tensor) is left out."""
    return tensor_bytes(v for s in optimizer.state.values() for key, v in s.items()
                        if key != "step" and torch.is_tensor(v))


class ZeroStage1(nn.Module):
    """ZeRO stage 1 around `module` (its parameters replicated on every rank). `units`:
    the layers each laid out flat (default: the module's top-level children)."""

    stage = 1

    def __init__(self, module: nn.Module, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 group=None, units: list[nn.Module] | None = None):
        super().__init__()
        validate_adam(lr, betas, eps)
        units = default_units(module) if units is None else list(units)
        check_units(module, units)                       # all before any collective
        self.module, self.group = module, group
        self.world_size, self.rank = dist.get_world_size(group), dist.get_rank(group)
        names = {id(m): n for n, m in module.named_modules()}
        self.units = [FlatUnit(m, self.world_size, self.rank, names.get(id(m), f"unit{i}"))
                      for i, m in enumerate(units)]
        self.shards = [self._make_shard(u) for u in self.units]   # (S,) per unit: what Adam updates
        self.optimizer = torch.optim.Adam(self.shards, lr=lr, betas=tuple(betas), eps=eps, foreach=False)
        self._setup()

    # --- what differs from stage to stage ------------------------------------------------
    def _make_shard(self, unit: FlatUnit) -> nn.Parameter:
        # a view of the flat parameters: Adam writes the layer's own memory, no copy
        return nn.Parameter(unit.my_shard(unit.flat))

    def _setup(self) -> None:
        # the gradients, too, live in one flat buffer per unit: autograd accumulates into them
        self.flat_grads = [torch.zeros_like(u.flat) for u in self.units]
        for u, g in zip(self.units, self.flat_grads):
            for p, view in zip(u.params, u.views(g)):
                p.grad = view

    @torch.no_grad()
    def _reduce_gradients(self) -> None:
        for u, g, shard in zip(self.units, self.flat_grads, self.shards):
            dist.all_reduce(g, group=self.group)             # Σ_r grad_r, all N·S of it
            g.div_(self.world_size)                          # the data-parallel mean
            shard.grad = u.my_shard(g)                       # Adam reads only my slice

    @torch.no_grad()
    def _gather_parameters(self) -> None:
        for u, shard in zip(self.units, self.shards):
            u.gather_full(shard.detach().clone(), self.group)  # clone: input may not alias output

    # --- the training API -----------------------------------------------------------------
    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def step(self) -> None:
        """After backward: reduce the gradients, Adam on this rank's shards, then give every
        rank the updated parameters."""
        self._reduce_gradients()
        self.optimizer.step()
        self._gather_parameters()

    def zero_grad(self) -> None:
        for g in self.flat_grads:
            g.zero_()                                        # in place: p.grad stay views of g

    def full_parameters(self) -> torch.Tensor:
        """All parameters as one flat vector (Ψ,), unit by unit (the model's order for the
        default units). Stage 3 gathers them first: a collective there, call it on every rank."""
        return torch.cat([p.detach().reshape(-1) for u in self.units for p in u.params])

    def num_params(self) -> int:
        return sum(u.numel for u in self.units)

    def memory(self) -> dict:
        """Bytes this rank holds now: {"parameters", "gradients", "optimizer"}, each storage
        counted once (the shards are views of the flat buffers in stages 1 and 2)."""
        params = [p for u in self.units for p in u.params] + list(self.shards)
        grads = [p.grad for p in params if p.grad is not None]
        return {"parameters": tensor_bytes(params), "gradients": tensor_bytes(grads),
                "optimizer": adam_state_bytes(self.optimizer)}

    def layout(self) -> list[dict]:
        """Per unit: name, numel, shard numel S and this rank's [lo, hi) in the flat buffer."""
        return [{"unit": u.name, "numel": u.numel, "shard_numel": u.shard_numel, "lo": u.lo, "hi": u.hi}
                for u in self.units]
