"""ZeRO stage 3 (P_os+g+p): also keep only this rank's 1/N of the parameters.

Rajbhandari et al. 2020, "ZeRO", Sec. 5.3: a layer's full parameters are needed only
while that layer runs, so between uses each rank keeps just its shard, and the owner
ranks broadcast the rest when needed; here that is one all-gather of the layer's shards.

    forward, before layer u   all_gather(shards_u) -> flat_u (N·S,)       (forward pre-hook)
    forward, after layer u    free flat_u                                 (forward hook)
    backward, before layer u  all_gather again                            (hook on u's output grad)
    backward, after layer u   reduce_scatter grad_u -> my (S,); free flat_u and grad_u
    step                      Adam on my shards: nothing to gather, the next forward does it

Per rank at rest: (2 + 2 + K)Ψ/N bytes; fp32 here: 16Ψ/N. During the step the full
parameters of about one layer are alive at a time (`peak_full_param_bytes` measures it).
Communication: 1.5x a plain all-reduce (Sec. 7.2.2): two all-gathers and one
reduce-scatter of Ψ per step, 3(N-1)/N·Ψ per rank on a ring (`sent_bytes`; the gathers of
`full_parameters`, an inspection, are not counted). Freeing is `untyped_storage().resize_(0)` on the flat
buffer (the layer's parameters stay as views, as in torch FSDP v1); autograd's saved
copies of the weights are those views, which are valid again once re-gathered.
Taught in `notebooks/11_memory_sharding.ipynb`.
"""
from __future__ import annotations

import torch
from torch import nn

from ddnb.sharding.flat import FlatUnit
from ddnb.sharding.zero2 import ZeroStage2


class ZeroStage3(ZeroStage2):
    """ZeRO stage 3: parameters sharded and all-gathered on demand, layer by layer, in
    forward and backward. Same API as `ZeroStage1`."""

    stage = 3

    def _make_shard(self, unit: FlatUnit) -> nn.Parameter:
        return nn.Parameter(unit.my_shard(unit.flat).clone())   # its own (S,) storage

    def _setup(self) -> None:
        super()._setup()
        self.gathers = 0                         # all-gathers done (2 per unit per step)
        self.peak_full_param_bytes = 0           # most gathered-parameter bytes alive at once
        for i, u in enumerate(self.units):
            u.free_full()                        # from now on only the shard is kept
            u.module.register_forward_pre_hook(lambda m, args, i=i: self._gather(i))
            u.module.register_forward_hook(lambda m, args, out, i=i: self._after_forward(i, out))

    def _gather(self, i: int) -> None:
        u = self.units[i]
        if u.full_bytes() == 0:
            self._all_gather(u, self.shards[i])
            self.gathers += 1
            self.peak_full_param_bytes = max(self.peak_full_param_bytes, self.full_param_bytes())

    def _after_forward(self, i: int, out) -> None:
        self.units[i].free_full()
        if torch.is_tensor(out) and out.requires_grad:
            out.register_hook(lambda grad, i=i: self._gather(i))   # backward is about to need them

    def _after_reduce(self, i: int) -> None:
        # all of unit i's gradients are accumulated, so every node that used its weights has
        # run: the gathered parameters can go
        self.units[i].free_full()

    def full_param_bytes(self) -> int:
        """Bytes of gathered (full) parameters alive now, over all units."""
        return sum(u.full_bytes() for u in self.units)

    def _gather_parameters(self) -> None:
        pass                                     # on demand, in the next forward

    @torch.no_grad()
    def full_parameters(self) -> torch.Tensor:
        """All parameters (Ψ,), gathered unit by unit and freed again (a collective)."""
        out = []
        for i, u in enumerate(self.units):
            u.gather_full(self.shards[i], self.group)
            out += [p.detach().reshape(-1).clone() for p in u.params]
            u.free_full()
        return torch.cat(out)
