"""The uncompressed all-reduce, then the first compression: send the gradients in 16 bits.

    state = HookState(group=None, tracer=tracer)
    ddp.register_comm_hook(state, allreduce_hook)       # 4 bytes / element: the baseline
    ddp.register_comm_hook(state, fp16_hook)            # 2 bytes / element
    ddp.register_comm_hook(state, bf16_hook)            # 2 bytes / element

`fp16_hook` and `bf16_hook` do what torch's `default_hooks.fp16_compress_hook` and
`bf16_compress_hook` do (the reference, equal to them bit for bit): cast the bucket to the
16-bit type, divide by N, all-reduce the sum, cast back. Bytes per step = 2 · numel
instead of 4 · numel, a 2× compression, with no state and no error feedback: the
rounding error of one cast is ~2^-11 relative (fp16, 10-bit mantissa, but a range of only
6e-5..65504: small gradients underflow, which is why fp16 *training* needs loss scaling,
Micikevicius et al. 2018) or ~2^-8 (bf16, 7-bit mantissa, fp32's range; Kalamkar et al.
2019). Horovod's `Compression.fp16` is the same cast around its all-reduce.
Taught in `notebooks/14_precision_compression.ipynb`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ddnb.compression.comm import allreduce, done
from ddnb.trace import Tracer


@dataclass
class HookState:
    """A stateless hook's state: the group, the tracer, and the step its events carry."""

    group: object = None
    tracer: Tracer | None = None
    step: int = 0

    def advance(self, bucket) -> None:
        if bucket.is_last():
            self.step += 1


def allreduce_hook(state: HookState, bucket):   # -> Future[Tensor] (unannotated: DDP checks annotations)
    """The mean over the ranks, uncompressed (torch's `default_hooks.allreduce_hook`),
    traced: 4 bytes per fp32 element."""
    buffer = bucket.buffer()                                       # (numel,)
    buffer.div_(dist.get_world_size(state.group))
    allreduce(buffer, state.group, state.tracer, "allreduce", method="none", step=state.step, bucket=bucket.index())
    state.advance(bucket)
    return done(buffer)


def _cast_hook(dtype: torch.dtype, method: str):
    def hook(state: HookState, bucket):   # -> Future[Tensor] (unannotated: DDP checks annotations)
        buffer = bucket.buffer()                                   # (numel,) fp32
        half = buffer.to(dtype).div_(dist.get_world_size(state.group))   # (numel,) 16-bit: cast, then / N
        allreduce(half, state.group, state.tracer, f"allreduce {method}", method=method, step=state.step,
                  bucket=bucket.index())
        buffer.copy_(half)                                         # back to fp32
        state.advance(bucket)
        return done(buffer)
    hook.__name__ = f"{method}_hook"
    hook.__doc__ = f"The mean over the ranks, sent as {dtype}: 2 bytes per element (see the module docstring)."
    return hook


fp16_hook = _cast_hook(torch.float16, "fp16")
bf16_hook = _cast_hook(torch.bfloat16, "bf16")


def half_bytes(numel: int) -> int:
    """Bytes per step of fp16_hook / bf16_hook over `numel` gradient elements."""
    return 2 * numel
