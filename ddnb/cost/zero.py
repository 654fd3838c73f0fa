"""Bytes of model states per device, and bytes each sends per step, under ZeRO, stage 0
(plain data parallel) to 3.

Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models", Sec. 3.1 and Sec. 5 (Figure 1). With mixed-precision Adam each of the Ψ
parameters costs 2 bytes (fp16 parameter) + 2 bytes (fp16 gradient) + K bytes of
optimizer state (fp32 master parameter, momentum and variance: K = 12). On N data-parallel
devices:

    stage 0  (P_none)     (2 + 2 + K) Ψ               every device holds everything
    stage 1  (P_os)       (2 + 2) Ψ + K Ψ / N         optimizer state sharded
    stage 2  (P_os+g)     2 Ψ + (2 + K) Ψ / N         ... and gradients
    stage 3  (P_os+g+p)   (2 + 2 + K) Ψ / N           ... and parameters

The paper's example, Ψ = 7.5 B, N = 64, K = 12: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB.
`param_bytes` and `grad_bytes` generalize the 2 and 2: plain fp32 Adam (what
`ddnb.sharding` runs on CPU) is param_bytes=4, grad_bytes=4, k=8 (momentum and variance).

`zero_comm_bytes` is the traffic (Sec. 7.2): bytes one device sends per step with ring
collectives, (N-1)/N of the buffer per reduce-scatter or all-gather, twice that per
all-reduce. Stage 0 all-reduces the gradients; stages 1 and 2 reduce-scatter them and
all-gather the updated parameters, the same 2(N-1)/N·Ψ; stage 3 all-gathers the parameters
twice (forward and backward), 1.5x. Taught in `notebooks/11_memory_sharding.ipynb`.

    zero_memory(7.5e9, 64, stage=3)              # 1.875e9 bytes
    zero_memory_parts(7.5e9, 64, stage=1)        # {"parameters": 1.5e10, "gradients": 1.5e10, "optimizer": 1.41e9}
    zero_comm_bytes(7.5e9, 64, stage=1)          # 2.95e10 bytes sent per device per step, as stage 0
"""
from __future__ import annotations

from ddnb._checks import Checks, is_int

STAGES = (0, 1, 2, 3)


def _validate(where: str, num_params, world_size, stage, k, param_bytes, grad_bytes) -> None:
    with Checks(where) as check:
        check.number("num_params", num_params, positive=True)
        check.integer("world_size", world_size, min=1)
        check.rule(is_int(stage) and stage in STAGES, f"stage={stage!r}: need one of {list(STAGES)} (0: plain "
                   f"data parallel, 1: optimizer state, 2: + gradients, 3: + parameters sharded)")
        for name, v in (("k", k), ("param_bytes", param_bytes), ("grad_bytes", grad_bytes)):
            check.number(name, v, min=0, why=" (bytes per parameter)")


def zero_memory_parts(num_params, world_size: int, stage: int, k: float = 12, param_bytes: float = 2,
                      grad_bytes: float = 2) -> dict:
    """{"parameters", "gradients", "optimizer"}: bytes of each model state on one device
    under ZeRO `stage` (Rajbhandari et al. 2020, Sec. 5, Figure 1). Stage s divides the
    optimizer state by N from s >= 1, the gradients from s >= 2, the parameters at s = 3."""
    _validate("zero_memory_parts", num_params, world_size, stage, k, param_bytes, grad_bytes)
    n, psi = world_size, num_params
    return {"parameters": param_bytes * psi / (n if stage >= 3 else 1),
            "gradients": grad_bytes * psi / (n if stage >= 2 else 1),
            "optimizer": k * psi / (n if stage >= 1 else 1)}


def zero_memory(num_params, world_size: int, stage: int, k: float = 12, param_bytes: float = 2,
                grad_bytes: float = 2) -> float:
    """Bytes of model states (parameters + gradients + optimizer state) per device under
    ZeRO `stage` 0-3 with mixed-precision Adam: (2 + 2 + K)Ψ, 4Ψ + KΨ/N, 2Ψ + (2 + K)Ψ/N,
    (2 + 2 + K)Ψ/N (Rajbhandari et al. 2020, Sec. 5, Figure 1). Activations, temporary
    buffers and fragmentation (the paper's "residual states", Sec. 3.2) are not included."""
    _validate("zero_memory", num_params, world_size, stage, k, param_bytes, grad_bytes)
    return sum(zero_memory_parts(num_params, world_size, stage, k, param_bytes, grad_bytes).values())


def zero_comm_bytes(num_params, world_size: int, stage: int, param_bytes: float = 2, grad_bytes: float = 2) -> float:
    """Bytes one device sends per training step under ZeRO `stage` with ring collectives
    (Rajbhandari et al. 2020, Sec. 7.2; the ring: Patarasuk & Yuan 2009), f = (N-1)/N:

        stage 0       all-reduce of the gradients                      2 f Ψ grad_bytes
        stages 1, 2   reduce-scatter gradients, all-gather parameters  f Ψ (grad_bytes + param_bytes)
        stage 3       + a second all-gather (forward and backward)     f Ψ (grad_bytes + 2 param_bytes)

    The paper writes f ≈ 1 (2Ψ, 2Ψ, 3Ψ elements). ddnb's flat buffers are padded to a
    multiple of N (`ddnb.sharding.flat`): pass their padded size N·S to get its count exactly."""
    _validate("zero_comm_bytes", num_params, world_size, stage, 0, param_bytes, grad_bytes)
    f = (world_size - 1) / world_size
    if stage == 0:
        return 2 * f * num_params * grad_bytes
    return f * num_params * (grad_bytes + (2 if stage == 3 else 1) * param_bytes)
