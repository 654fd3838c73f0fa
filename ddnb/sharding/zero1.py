"""ZeRO stage 1 (P_os): every rank keeps Adam's state only for its 1/N of the parameters.

Rajbhandari et al. 2020, "ZeRO", Sec. 5.1: with N data-parallel ranks, rank r updates
only the parameters of its partition, so it needs Adam's momentum and variance (the K·Ψ
of the paper) only for Ψ/N of them; after the step, an all-gather gives every rank the
updated parameters. Per rank: (2 + 2)Ψ + KΨ/N bytes instead of (2 + 2 + K)Ψ.

The step, per unit (layer) u, laid out by `ddnb.sharding.flat.FlatUnit`:

    g_r  = reduce_scatter(flat grad_u) / N    (N·S,) -> (S,)  my slice of the data-parallel mean
    Adam on shard_u = flat_u[r·S:(r+1)·S]     (S,)            with only this shard's grad and state
    flat_u = all_gather(shard_u from each r)  (S,) -> (N·S,)  every rank: the updated layer

An all-reduce is a reduce-scatter followed by an all-gather (the ring does exactly these
two phases). Rank r reads only its slice of the mean gradient, so it stops after the
reduce-scatter, and the all-gather it skips is replaced by the all-gather of the updated
parameters: per rank (N-1)/N·Ψ sent in each, 2(N-1)/N·Ψ in all, the same as plain data
parallelism's all-reduce (Sec. 7.2.1: "P_os ... incur no additional communication").
All-reducing the whole gradient and then all-gathering would send 3(N-1)/N·Ψ, 1.5x.
The full gradient buffer still exists here (each rank's own, unreduced, outside its
slice): freeing it as backward goes is stage 2 (`zero2.py`).

Every collective is recorded in `tracer` ("collective" events, `nbytes` = the flat
buffer's bytes N·S·4, `sent` = what this rank sends on a ring) and summed, per kind, in
`sent_bytes` (`ring_bytes_sent`); `ddnb.cost.zero_comm_bytes` is the formula it equals.

fp32 on CPU here (ddnb's clusters are gloo): parameters and gradients take 4 bytes and
Adam's state 8 (K = 8), not the paper's fp16 2 + 2 with fp32 K = 12; `memory()` counts
what this rank really holds. Taught in `notebooks/11_memory_sharding.ipynb`.

    zero = ZeroStage1(model, lr=1e-3)        # model replicated on every rank (same seed)
    loss = lm_loss(zero(idx), targets)       # idx: this rank's part of the batch
    loss.backward()
    zero.step()                              # reduce-scatter grads, Adam on my shard, all-gather
    zero.zero_grad()
    zero.sent_bytes                          # {"reduce_scatter": ..., "all_gather": ...} so far
"""
from __future__ import annotations


import torch
import torch.distributed as dist
from torch import nn

from ddnb._checks import Checks, is_number
from ddnb.collectives import traced
from ddnb.memory import tensor_bytes
from ddnb.sharding.flat import UNTRACED, FlatUnit, check_units, default_units
from ddnb.trace import Tracer, get_tracer, now

RING_PHASES = {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1}   # phases of (N-1) chunks of S each


def ring_bytes_sent(collective: str, nbytes: float, world_size: int) -> float:
    """Bytes one rank sends in `collective` ("all_reduce", "reduce_scatter", "all_gather")
    over a buffer of `nbytes` (the full (N·S,) tensor) on a ring (Patarasuk & Yuan 2009):
    (N-1)/N·nbytes per phase; an all-reduce is two phases, a reduce-scatter or an all-gather
    one (ZeRO Sec. 7.1); `ddnb.cost.allreduce_bytes_per_rank`'s "ring" is the two-phase
    case. What gloo's own algorithm sends on the wire may differ."""
    if collective not in RING_PHASES:
        raise ValueError(f"collective={collective!r} is not one of {list(RING_PHASES)}")
    with Checks("ring_bytes_sent") as check:
        check.number("nbytes", nbytes, min=0)
        check.integer("world_size", world_size, min=1)
    return (world_size - 1) / world_size * float(nbytes) * RING_PHASES[collective]


def validate_adam(lr, betas, eps, check: Checks) -> None:
    """Adam's lr > 0, betas two numbers in [0, 1), eps > 0: added to `check`."""
    check.number("lr", lr, positive=True)
    check.rule(isinstance(betas, (tuple, list)) and len(betas) == 2 and all(is_number(b) and 0 <= b < 1
                                                                             for b in betas),
               f"betas={betas!r}: need two numbers in [0, 1)")
    check.number("eps", eps, positive=True)


def adam_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of Adam's momentum and variance (exp_avg, exp_avg_sq) in `optimizer`: the
    paper's K·Ψ. The step counter (one 4-byte scalar per tensor) is left out."""
    return tensor_bytes(v for s in optimizer.state.values() for key, v in s.items()
                        if key != "step" and torch.is_tensor(v))


class ZeroStage1(nn.Module):
    """ZeRO stage 1 around `module` (its parameters replicated on every rank). `units`:
    the layers each laid out flat (default: the module's top-level children). `tracer`
    records the collectives (default: the process's `ddnb.trace.get_tracer()`)."""

    stage = 1

    def __init__(self, module: nn.Module, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 group=None, units: list[nn.Module] | None = None, tracer: Tracer | None = None):
        super().__init__()
        units = default_units(module) if units is None else list(units)
        with Checks(type(self).__name__) as check:       # all before any collective
            validate_adam(lr, betas, eps, check)
            check_units(module, units, check)
        self.module, self.group, self.tracer = module, group, tracer
        self.sent_bytes = {"reduce_scatter": 0.0, "all_gather": 0.0}   # this rank, on a ring, since start
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
            mine = u.my_shard(g)                             # (S,) a view of my slice of g
            shard.grad = mine.copy_(self._reduce_scatter(u, g))   # Adam reads only my slice

    @torch.no_grad()
    def _gather_parameters(self) -> None:
        for u, shard in zip(self.units, self.shards):
            self._all_gather(u, shard.detach().clone())     # clone: input may not alias output

    # --- the two collectives, counted (Sec. 7.2.1) -----------------------------------------
    def _reduce_scatter(self, u: FlatUnit, g: torch.Tensor) -> torch.Tensor:
        """g (N·S,): this rank's gradient of unit u -> (S,) the mean over ranks of my slice."""
        start = now()
        mine = traced.reduce_scatter(list(g.view(self.world_size, -1)), group=self.group,   # (S,):
                                     tracer=UNTRACED)                  # Σ_r my slice of grad_r
        self._count("reduce_scatter", u, g, start)
        return mine.div_(self.world_size)                              # the data-parallel mean

    def _all_gather(self, u: FlatUnit, shard: torch.Tensor) -> None:
        """Every rank's (S,) shard of unit u -> its full flat parameters (N·S,)."""
        start = now()
        u.gather_full(shard, self.group)
        self._count("all_gather", u, u.flat, start)

    def _count(self, collective: str, u: FlatUnit, full: torch.Tensor, start: float) -> None:
        nbytes = full.numel() * full.element_size()                    # the (N·S,) buffer
        sent = ring_bytes_sent(collective, nbytes, self.world_size)
        self.sent_bytes[collective] += sent
        get_tracer(self.tracer).record("collective", f"{collective} {u.name}", start, now(),
                                       nbytes=nbytes, sent=sent, unit=u.name, stage=self.stage)

    # --- the training API -----------------------------------------------------------------
    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def step(self) -> None:
        """After backward: reduce-scatter the gradients (each rank gets the mean of its
        shard), Adam on this rank's shards, then all-gather the updated parameters."""
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
