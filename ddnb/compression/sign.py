"""1-bit compression with error feedback: send each gradient entry's sign, one bit, and
one scale per tensor (Seide et al., "1-Bit Stochastic Gradient Descent and its
Application to Data-Parallel Distributed Training of Speech DNNs", Interspeech 2014, with
error feedback; Bernstein et al., "signSGD: Compressed Optimisation for Non-Convex
Problems", ICML 2018; Karimireddy et al., "Error Feedback Fixes SignSGD and other
Gradient Compression Schemes", ICML 2019, Algorithm 1, EF-SignSGD).

On every rank w, for each gradient tensor of the bucket (d elements):

    p = g_w + e_w                      the gradient plus last step's error
    Δ = (‖p‖₁ / d) · sign(p)           the scaled sign (Karimireddy et al., Alg. 1 line 5):
                                       the scale keeps the step's size, the sign its direction
    e_w = p − Δ                        error feedback: what the 1 bit could not say
    send sign(p) as bits, and ‖p‖₁/d   d/8 bytes + 4 bytes
    ĝ = (1/N) Σ_w Δ_w                  every rank rebuilds every rank's Δ and averages

A sign of 0 is sent as +1 (one bit has no third value). The bits of a whole bucket are
packed 8 to a byte (`pack_signs`), so a bucket of D elements in T tensors hands
ceil(D/8) + 4T bytes to the collectives (`sign_bytes`): ~32× less than fp32. Like top-k
it all-gathers rather than all-reduces: the packed bytes of two ranks cannot be added
(adding the bytes would carry between the bits), and unpacked, summed signs would need
log2(N)+1 bits each. Taught in `notebooks/14_precision_compression.ipynb`.

    state = SignState()
    ddp.register_comm_hook(state, sign_hook)
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ddnb.compression.comm import allgather, done
from ddnb.trace import Tracer

_WEIGHTS = torch.tensor([128, 64, 32, 16, 8, 4, 2, 1], dtype=torch.uint8)


class SignState:
    """EF-SignSGD's memory: the error e (numel,) per bucket index."""

    def __init__(self, process_group=None, use_error_feedback: bool = True, tracer: Tracer | None = None):
        self.process_group, self.use_error_feedback, self.tracer = process_group, use_error_feedback, tracer
        self.error_dict: dict[int, torch.Tensor] = {}
        self.iter = 0


def pack_signs(x: torch.Tensor) -> torch.Tensor:
    """The signs of the flat `x` (D,) as bits, 8 to a byte, the first entry the high bit:
    (ceil(D/8),) uint8; bit 1 for x >= 0, 0 for x < 0."""
    bits = (x >= 0).to(torch.uint8)                                      # (D,)
    pad = (-bits.numel()) % 8
    bits = torch.cat([bits, bits.new_zeros(pad)]).view(-1, 8)            # (ceil(D/8), 8)
    return (bits * _WEIGHTS.to(bits.device)).sum(1, dtype=torch.uint8)


def unpack_signs(packed: torch.Tensor, numel: int, dtype=torch.float32) -> torch.Tensor:
    """±1 (numel,) from `pack_signs`'s bytes."""
    bits = (packed.unsqueeze(-1) & _WEIGHTS.to(packed.device)) > 0       # (ceil(D/8), 8)
    return bits.reshape(-1)[:numel].to(dtype) * 2 - 1


def scaled_sign(p: torch.Tensor) -> torch.Tensor:
    """Δ = (‖p‖₁ / d) · sign(p), with sign(0) = +1 (what the bits can say)."""
    return torch.where(p >= 0, 1.0, -1.0).to(p.dtype) * (p.abs().sum() / p.numel())


def sign_bytes(numels) -> int:
    """Bytes a rank hands to the all-gathers per bucket and step, for a bucket whose
    tensors have these numels: ceil(D/8) bytes of signs + 4 bytes of scale per tensor."""
    return math.ceil(sum(numels) / 8) + 4 * len(numels)


def sign_hook(state: SignState, bucket):   # -> Future[Tensor] (unannotated: DDP checks annotations)
    """A DDP communication hook: the mean over the ranks of every rank's scaled signs."""
    group, buffer, b = state.process_group, bucket.buffer(), bucket.index()   # buffer (numel,)
    fields = dict(method="sign", step=state.iter, bucket=b)
    if state.use_error_feedback and b in state.error_dict:
        buffer.add_(state.error_dict[b])                                 # p = g + e
    sizes = [t.numel() for t in bucket.gradients()]
    parts = buffer.split(sizes)                                          # one (d,) per tensor
    scales = torch.stack([p.abs().sum() / p.numel() for p in parts])     # (T,) ‖p‖₁/d
    bits = pack_signs(buffer)                                            # (ceil(D/8),) uint8
    if state.use_error_feedback:
        state.error_dict[b] = buffer - torch.cat([scaled_sign(p) for p in parts])   # e = p − Δ
    all_bits = allgather(bits, group, state.tracer, "sign: bits", **fields)       # (N, ceil(D/8))
    all_scales = allgather(scales, group, state.tracer, "sign: scales", **fields)  # (N, T)
    total = torch.zeros_like(buffer)
    for w in range(all_bits.shape[0]):                                   # Σ_w Δ_w, rank by rank
        signs = unpack_signs(all_bits[w], buffer.numel(), buffer.dtype)  # (D,)
        total += signs * torch.repeat_interleave(all_scales[w], torch.tensor(sizes, device=buffer.device))
    buffer.copy_(total).div_(dist.get_world_size(group))
    if bucket.is_last():
        state.iter += 1
    return done(buffer)
