"""Solution of `ddnb.exercises.flops` (`notebooks/01_why_distributed.ipynb`)."""
from __future__ import annotations


def flops_per_token(n_layers: int, d_model: int, vocab_size: int, seq_len: int) -> int:
    """6·N for the weights (2 forward, 4 backward) + 12·L·T·d for attention's QKᵀ and AV."""
    n = 12 * n_layers * d_model ** 2 + vocab_size * d_model     # matmul weights: blocks + output projection
    return 6 * n + 12 * n_layers * seq_len * d_model
