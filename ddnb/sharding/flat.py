"""One layer's parameters as one flat, padded buffer, split into N equal shards.

ZeRO partitions the model states into N equal parts, one per data-parallel rank
(Rajbhandari et al. 2020, Sec. 5). To make "rank r's part" a single contiguous slice,
each *unit* (a layer: an nn.Module such as one Transformer block) lays its parameters end
to end in one flat vector, padded with zeros to a multiple of N:

    flat   (N·S,)   [ p_0 ... p_k | pad ]        p_i = flat[off_i : off_i + numel_i].view(shape_i)
    shard  (S,)     flat[r·S : (r+1)·S]          S = ceil(numel / N): what rank r owns

The module's parameters become views of `flat` (so writing the flat buffer writes the
layer), one all-gather of the shards rebuilds `flat`, and one reduce-scatter of a flat
gradient leaves each rank the sum of its shard. DeepSpeed's ZeRO and torch's FSDP (v1,
`FlatParameter`) use this layout; FSDP2 shards each parameter on dim 0 instead.
Taught in `notebooks/11_memory_sharding.ipynb`.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn

from ddnb._checks import Checks
from ddnb.collectives import traced
from ddnb.trace import Tracer

UNTRACED = Tracer(enabled=False)   # the traced layer times (and, emulated, models) ZeRO's collectives;
                                   # the ZeRO classes record their own events, with the unit's name


def shard_numel(numel: int, world_size: int) -> int:
    """S = ceil(numel / N): the elements of one shard of a flat buffer padded to N·S."""
    with Checks("shard_numel") as check:
        check.integer("numel", numel, min=0)
        check.integer("world_size", world_size, min=1)
    return math.ceil(numel / world_size)


def default_units(model: nn.Module) -> list[nn.Module]:
    """The model's top-level children that hold parameters (for ddnb.models.gpt: the
    embedding, each block and the head). Every parameter must sit in exactly one unit."""
    units = [m for m in model.children() if any(True for _ in m.parameters())]
    in_units = {id(p) for m in units for p in m.parameters()}
    loose = [n for n, p in model.named_parameters() if id(p) not in in_units]
    if loose:
        raise ValueError(f"parameters {loose} are not inside a child module; pass units= explicitly")
    return units


def check_units(model: nn.Module, units: list[nn.Module], check: Checks) -> None:
    """Every trainable parameter of `model` in exactly one unit: added to `check`, naming them."""
    names = {id(p): n for n, p in model.named_parameters()}
    owner: dict[int, int] = {}
    twice = []
    for i, m in enumerate(units):
        for p in m.parameters():
            if id(p) in owner:
                twice.append(f"{names.get(id(p), '?')} (units {owner[id(p)]} and {i})")
            owner[id(p)] = i
    missing = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in owner]
    check.rule(not (twice or missing), f"each parameter must be in exactly one unit: in two units: "
               f"{twice or 'none'}, in none: {missing or 'none'}")


class FlatUnit:
    """The parameters of `module` as views of one flat buffer (N·S,) on this rank, and
    this rank's shard of it. Built from the module's current values (replicated on every
    rank by the caller); the module's parameters are re-pointed into `flat`."""

    def __init__(self, module: nn.Module, world_size: int, rank: int, name: str = ""):
        self.module, self.name = module, name
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.shapes = [p.shape for p in self.params]
        self.numels = [p.numel() for p in self.params]
        self.numel = sum(self.numels)
        self.world_size, self.rank = world_size, rank
        self.shard_numel = shard_numel(self.numel, world_size)               # S
        self.padded_numel = self.shard_numel * world_size                     # N·S
        self.lo, self.hi = rank * self.shard_numel, (rank + 1) * self.shard_numel
        p0 = self.params[0]
        self.flat = torch.zeros(self.padded_numel, dtype=p0.dtype, device=p0.device)   # (N·S,)
        with torch.no_grad():
            for p, view in zip(self.params, self.views(self.flat)):
                view.copy_(p)
                p.data = view                                                 # the layer reads `flat`

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """flat (N·S,) -> one view per parameter, in its shape."""
        out, off = [], 0
        for shape, n in zip(self.shapes, self.numels):
            out.append(flat[off:off + n].view(shape))
            off += n
        return out

    def my_shard(self, flat: torch.Tensor) -> torch.Tensor:
        """This rank's slice (S,) of a flat (N·S,) buffer, as a view."""
        return flat[self.lo:self.hi]

    def flat_grad(self) -> torch.Tensor:
        """The parameters' gradients laid out as `flat` (N·S,), zeros where None or padding."""
        g = torch.zeros_like(self.flat)
        for p, view in zip(self.params, self.views(g)):
            if p.grad is not None:
                view.copy_(p.grad)
        return g

    # --- storage of the full (gathered) parameters, for stage 3 -------------------------
    def full_bytes(self) -> int:
        """Bytes the gathered parameters hold now (0 when freed)."""
        return self.flat.untyped_storage().nbytes()

    def free_full(self) -> None:
        """Release the gathered parameters' memory; the views stay, pointing at nothing
        until `gather_full` (the `storage().resize_(0)` trick of torch FSDP v1)."""
        self.flat.untyped_storage().resize_(0)

    def gather_full(self, shard: torch.Tensor, group=None) -> None:
        """Re-allocate `flat` and fill it with every rank's shard: one all-gather."""
        storage = self.flat.untyped_storage()
        if storage.nbytes() == 0:
            storage.resize_(self.padded_numel * self.flat.element_size())
        traced.all_gather(shard.detach(), group=group, tracer=UNTRACED, out=self.flat)   # (N·S,) <- N x (S,)
