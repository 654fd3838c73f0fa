"""What naive model parallelism should cost, before it is measured (notebook 08).

Communication. Between stage s and s + 1 forward sends the activation, backward sends its
gradient, of the same shape: for a transformer split between blocks that is the residual
stream, B·T·d elements (batch, sequence length, width). With p stages, a step sends

    forward  (p - 1)·B·T·d·e bytes,   backward  (p - 1)·B·T·d·e bytes        (e: bytes/element)

independent of the number of parameters: model parallelism moves activations, data
parallelism moves gradients of the parameters (2(p-1)/p·Ψ·e per rank for a ring).

Time. Stages run one after another, so a step takes Σ_r t_r (plus the messages) and rank r
computes t_r of it: its idle fraction is 1 - t_r / Σ t, on average (p - 1)/p whatever the
partition (GPipe, Huang et al. 2019, Sec. 2.2, Fig. 2b-c: the "bubble"; for equal stages
that mean is `ddnb.cost.pipeline.model_parallel_idle_fraction`).
Taught in `notebooks/08_model_parallelism.ipynb`.
"""
from __future__ import annotations

from ddnb._checks import Checks, check_positive_ints, is_number


def boundary_bytes(batch_size: int, seq_len: int, d_model: int, element_size: int = 4) -> int:
    """Bytes of one activation (B, T, d) crossing a stage boundary (and of its gradient)."""
    check_positive_ints("boundary_bytes", batch_size=batch_size, seq_len=seq_len, d_model=d_model,
                        element_size=element_size)
    return batch_size * seq_len * d_model * element_size


def model_parallel_bytes(stages: int, activation_bytes: int) -> dict:
    """Bytes one naive model-parallel step sends: {"forward", "backward", "total"} over all
    ranks, and "per_rank": what each rank sends (rank r sends forward if r < p - 1 and
    backward if r > 0)."""
    with Checks("model_parallel_bytes") as check:
        check.integer("stages", stages, min=1)
        check.number("activation_bytes", activation_bytes, min=0)
    a = activation_bytes
    per_rank = [(a if r < stages - 1 else 0) + (a if r > 0 else 0) for r in range(stages)]
    return {"forward": (stages - 1) * a, "backward": (stages - 1) * a, "total": 2 * (stages - 1) * a,
            "per_rank": per_rank}


def sequential_idle_fractions(stage_times) -> list[float]:
    """Idle fraction of each rank when stages with these compute times run one after
    another and messages are free: 1 - t_r / Σ t. Their mean is (p - 1)/p."""
    times = list(stage_times)
    if not times or not all(is_number(t) and t >= 0 for t in times) or sum(times) <= 0:
        raise ValueError(f"stage_times must be finite numbers >= 0 with a positive sum, got stage_times={times}")
    times = [float(t) for t in times]
    total = sum(times)
    return [1.0 - t / total for t in times]
