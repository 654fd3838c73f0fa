"""ZeRO stage 2 (P_os+g): also keep only this rank's 1/N of the gradients.

Rajbhandari et al. 2020, "ZeRO", Sec. 5.2: rank r's Adam needs the averaged gradient of
its own shard only. Stage 1 (`zero1.py`) already reduce-scatters, but only at the step,
with every layer's full gradient kept until then; here each layer's gradient is
reduce-scattered as soon as backward has produced it, and the full gradient is freed at
once. The paper's "bucketization" does this per bucket during backward; here a bucket is
one unit (layer), triggered when the last of its parameters' gradients is accumulated
(`Tensor.register_post_accumulate_grad_hook`).

    backward reaches layer u:  g_u (N·S,) -> reduce_scatter -> my (S,) / N; free g_u
    step:                      Adam on my shards, then all_gather the parameters (as stage 1)

Communication: the same collectives as stage 1, a reduce-scatter plus an all-gather,
exactly one ring all-reduce's volume (2(N-1)/N · Ψ per rank, Sec. 7.2.1, counted in
`sent_bytes`), so stage 2 saves memory at no extra traffic.
Per rank at rest: 2Ψ + (2 + K)Ψ/N bytes with mixed precision; fp32 here: 4Ψ + (4 + 8)Ψ/N.
Only one layer's full gradient exists at a time during backward (two while one is being
reduced). Several backwards per step (a pipeline's micro-batches, gradient accumulation)
reduce-scatter once each and add into the shard's gradient, as DeepSpeed's stage 2 does
at every micro-step: the same mean, m reduce-scatters instead of one.
Taught in `notebooks/11_memory_sharding.ipynb`.
"""
from __future__ import annotations

import torch

from ddnb.memory import tensor_bytes
from ddnb.sharding.flat import FlatUnit
from ddnb.sharding.zero1 import ZeroStage1


class ZeroStage2(ZeroStage1):
    """ZeRO stage 2: like `ZeroStage1`, with gradients reduce-scattered layer by layer in
    backward. Same API: forward, loss.backward(), step(), zero_grad(), memory()."""

    stage = 2

    def _setup(self) -> None:
        self.flat_grads = []
        self._pending = [0] * len(self.units)      # gradients still to come, per unit
        self._reduced = [False] * len(self.units)
        self.peak_full_grad_bytes = 0              # most full-gradient bytes alive at once
        for i, u in enumerate(self.units):
            for p in u.params:
                p.grad = None
                p.register_post_accumulate_grad_hook(lambda p, i=i: self._grad_ready(i))
        self._arm()

    def _arm(self) -> None:
        self._pending = [len(u.params) for u in self.units]
        self._reduced = [False] * len(self.units)

    def _full_grad_bytes(self) -> int:
        return tensor_bytes(p.grad for u in self.units for p in u.params if p.grad is not None)

    def _grad_ready(self, i: int) -> None:
        self._pending[i] -= 1
        if self._pending[i] == 0:
            self._reduce_unit(i)

    @torch.no_grad()
    def _reduce_unit(self, i: int) -> None:
        """Reduce-scatter unit i's gradient into this rank's shard, then free it."""
        u: FlatUnit = self.units[i]
        self.peak_full_grad_bytes = max(self.peak_full_grad_bytes, self._full_grad_bytes())
        g = u.flat_grad()                                              # (N·S,)
        mine = self._reduce_scatter(u, g)                              # (S,) the mean of my slice
        shard = self.shards[i]
        shard.grad = mine if shard.grad is None else shard.grad.add_(mine)   # summed over backwards
        for p in u.params:
            p.grad = None                                              # the full gradient is gone
        self._reduced[i] = True
        self._pending[i] = len(u.params)                               # armed for the next backward
        self._after_reduce(i)

    def _after_reduce(self, i: int) -> None:
        """Hook for stage 3 (free the gathered parameters too)."""

    def _reduce_gradients(self) -> None:
        # units whose gradients never all arrived (a parameter unused this step on every
        # rank) are reduced now, with zeros where a gradient is missing
        for i, done in enumerate(self._reduced):
            if not done:
                self._reduce_unit(i)
        self._arm()

    def zero_grad(self) -> None:
        for u, shard in zip(self.units, self.shards):
            shard.grad = None
            for p in u.params:
                p.grad = None
        self._arm()
