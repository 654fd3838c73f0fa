"""Model FLOPs of a GPT-style transformer, counted before it runs: the one definition that
`ddnb.throughput` (the MFU of a measured step) and `ddnb.cost.transformer` (compute and
days of training, which re-exports these) both read. No torch: a formula only.

    flops_per_token(n_layers, d_model, vocab_size, seq_len)      6·N_matmul + 12·L·T·d (PaLM, App. B)
    layer_flops_per_token(d_model, seq_len)                      one block's share: 6·(4 + 2r)·d² + 12·T·d
    matmul_params(n_layers, d_model, vocab_size)                 N_matmul: the weights that multiply
    matmul_flops(m, k, n)                                        2·m·k·n of one (m, k) @ (k, n)

Kaplan et al. 2020 ("Scaling Laws for Neural Language Models", Sec. 2.1): a forward pass
costs 2 FLOPs per weight per token (one multiply, one add) and backward twice that, so
6·N per token; Chowdhery et al. 2022 ("PaLM", Appendix B) add 12·L·T·d for QKᵀ and AV
over all T positions, forward and backward. Embedding lookups, biases and LayerNorms
multiply nothing and are left out of N. Taught in `notebooks/01_why_distributed.ipynb`.
"""
from __future__ import annotations

from ddnb._checks import check_positive_ints


def matmul_params(n_layers: int, d_model: int, vocab_size: int, mlp_ratio: int = 4) -> int:
    """The weights that multiply activations: (4 + 2r)·d² per block and the output
    projection V·d (embedding lookups, biases and LayerNorms cost no matmul FLOPs)."""
    check_positive_ints("matmul_params", n_layers=n_layers, d_model=d_model, vocab_size=vocab_size,
                        mlp_ratio=mlp_ratio)
    return n_layers * (4 + 2 * mlp_ratio) * d_model ** 2 + vocab_size * d_model


def layer_flops_per_token(d_model: int, seq_len: int, mlp_ratio: int = 4) -> int:
    """Model FLOPs of one block for one training token (forward + backward): 6·(4 + 2r)·d²
    for its matmul weights and 12·T·d for QKᵀ and AV over T positions. Forward alone is a
    third of it (2 per weight, 4·T·d), which is what activation checkpointing runs again."""
    check_positive_ints("layer_flops_per_token", d_model=d_model, seq_len=seq_len, mlp_ratio=mlp_ratio)
    return 6 * (4 + 2 * mlp_ratio) * d_model ** 2 + 12 * seq_len * d_model


def flops_per_token(n_layers: int, d_model: int, vocab_size: int, seq_len: int, mlp_ratio: int = 4) -> int:
    """Model FLOPs of one training token (forward + backward): 6·N + 12·L·T·d, with N the
    matmul weights (`matmul_params`) and 12·L·T·d for QKᵀ and AV over T positions, forward
    and backward (Chowdhery et al. 2022, "PaLM", Appendix B, with heads·head size = d):
    L blocks (`layer_flops_per_token`) and the output projection's 6·V·d."""
    check_positive_ints("flops_per_token", n_layers=n_layers, d_model=d_model, vocab_size=vocab_size,
                        seq_len=seq_len, mlp_ratio=mlp_ratio)
    return n_layers * layer_flops_per_token(d_model, seq_len, mlp_ratio) + 6 * vocab_size * d_model


def matmul_flops(m: int, k: int, n: int) -> int:
    """2·m·k·n: FLOPs of (m, k) @ (k, n), one multiply and one add per term."""
    check_positive_ints("matmul_flops", m=m, k=k, n=n)
    return 2 * m * k * n
