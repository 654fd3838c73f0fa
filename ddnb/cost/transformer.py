"""What training a GPT-style transformer costs in parameters, FLOPs and days, before it runs.

    transformer_params(n_layers, d_model, vocab_size, seq_len)   parameter count of a GPT
    training_flops(num_params, num_tokens)                       C ≈ 6·N·D
    flops_per_token(n_layers, d_model, vocab_size, seq_len)      6·N_matmul + 12·L·T·d (PaLM, App. B)
    model_flops_utilization(tokens_per_s, flops_per_token, peak)  MFU = achieved / peak FLOP/s
    training_days(total_flops, peak, n_devices, mfu, efficiency)  wall-clock days of a run

Parameters (Kaplan et al. 2020, "Scaling Laws for Neural Language Models", Sec. 2.1,
Table 1): a block has 4·d² in attention (W_Q, W_K, W_V, W_O) and 2·r·d² in its MLP
(d -> r·d -> d, r = 4), so N ≈ 12·L·d² without embeddings. Here every tensor is
counted: the biases and the two LayerNorms (13·d per block for r = 4), the token
(V·d) and learned position (T·d) embeddings, the final LayerNorm (2·d), and the output
projection (V·d) unless it is tied to the token embedding, as in GPT-2 and GPT-3.
GPT-3 175B (Brown et al. 2020, Table 2.1: 96 layers, d_model 12288, context 2048,
vocabulary 50257) comes out at 174.6e9.

FLOPs (Kaplan et al. 2020, Sec. 2.1): a forward pass costs 2·N FLOPs per token (one
multiply and one add per weight) plus 2·L·T·d for attention over T positions; backward
costs twice the forward, so a training step costs about 6·N FLOPs per token and a run
over D tokens C ≈ 6·N·D. Model FLOPs utilization (Chowdhery et al. 2022, "PaLM",
Sec. 4.1 and Appendix B) is the achieved rate of those model FLOPs, 6·N + 12·L·T·d per
token (counting QKᵀ and AV over all T), over the device's peak: recomputation and
other overheads don't count as useful work. The FLOP counts (`flops_per_token`,
`matmul_params`, `matmul_flops`) are defined in `ddnb.flops`, below the cost models, so
that `ddnb.throughput` reads them too, and are re-exported here.
Taught in `notebooks/01_why_distributed.ipynb`.
"""
from __future__ import annotations

from ddnb._checks import Checks, check_positive_ints
from ddnb.flops import flops_per_token, matmul_flops, matmul_params  # noqa: F401 (defined in ddnb.flops)

SECONDS_PER_DAY = 86_400


def block_params(d_model: int, mlp_ratio: int = 4) -> int:
    """Parameters of one pre-LayerNorm block: (4 + 2r)·d² weights and (9 + r)·d biases and
    LayerNorm gains/shifts (qkv 3d²+3d, attention projection d²+d, MLP r·d²+r·d and
    r·d²+d, two LayerNorms 2d each). r = 4: 12·d² + 13·d (Kaplan et al. 2020, Table 1)."""
    check_positive_ints("block_params", d_model=d_model, mlp_ratio=mlp_ratio)
    return (4 + 2 * mlp_ratio) * d_model ** 2 + (9 + mlp_ratio) * d_model


def transformer_params(n_layers: int, d_model: int, vocab_size: int, seq_len: int, mlp_ratio: int = 4,
                       tied_embeddings: bool = True) -> int:
    """Parameter count of a GPT-style decoder: n_layers blocks (`block_params`), token and
    position embeddings (V + T)·d, the final LayerNorm 2·d, and the output projection V·d
    unless `tied_embeddings` (GPT-2/GPT-3 reuse the token embedding; `ddnb.models.gpt` does
    not, so pass tied_embeddings=False to count it). GPT-3's configuration
    (96, 12288, 50257, 2048) gives 174.6e9 ≈ 175e9 (Brown et al. 2020, Table 2.1)."""
    check_positive_ints("transformer_params", n_layers=n_layers, d_model=d_model, vocab_size=vocab_size,
                        seq_len=seq_len, mlp_ratio=mlp_ratio)
    embeddings = (vocab_size + seq_len) * d_model
    head = 2 * d_model + (0 if tied_embeddings else vocab_size * d_model)
    return n_layers * block_params(d_model, mlp_ratio) + embeddings + head


def training_flops(num_params: float, num_tokens: float) -> float:
    """C ≈ 6·N·D: FLOPs to train N parameters on D tokens, 2·N per token forward and 4·N
    backward (Kaplan et al. 2020, Sec. 2.1; Hoffmann et al. 2022, "Chinchilla", Sec. 3).
    GPT-3: 6 · 175e9 · 300e9 = 3.15e23 (the paper states 3.14e23)."""
    with Checks("training_flops") as check:
        check.positive_numbers(num_params=num_params, num_tokens=num_tokens)
    return 6.0 * num_params * num_tokens


def model_flops_utilization(tokens_per_second: float, flops_per_token: float, peak_flops: float) -> float:
    """MFU = tokens/s · model FLOPs per token / peak FLOP/s of the device (Chowdhery et al.
    2022, Sec. 4.1). 1 would be every cycle spent on the model's own arithmetic."""
    with Checks("model_flops_utilization") as check:
        check.positive_numbers(tokens_per_second=tokens_per_second, flops_per_token=flops_per_token,
                               peak_flops=peak_flops)
    return tokens_per_second * flops_per_token / peak_flops


def training_days(total_flops: float, peak_flops: float, n_devices: int = 1, mfu: float = 0.4,
                  scaling_efficiency: float = 1.0) -> float:
    """Days to spend `total_flops` on n devices of `peak_flops` each, each running at `mfu`
    of its peak, the n together at `scaling_efficiency` of n times one (1: linear scaling):

        days = C / (n · E · MFU · peak) / 86400.

    GPT-3 (3.14e23 FLOPs) on A100s (312e12 FLOP/s in bf16) at 40% MFU: about 29,000 days
    on one, about 32 on 1024 at 90% efficiency. Narayanan et al. 2021 ("Efficient
    Large-Scale Language Model Training on GPU Clusters", Sec. 5.1) estimate 34 days on 1024
    A100s at 140 TFLOP/s each (45% of peak)."""
    with Checks("training_days") as check:
        check.positive_numbers(total_flops=total_flops, peak_flops=peak_flops)
        check.integer("n_devices", n_devices, min=1)
        check.number("mfu", mfu, positive=True, max=1)
        check.number("scaling_efficiency", scaling_efficiency, positive=True, max=1)
    return total_flops / (n_devices * scaling_efficiency * mfu * peak_flops) / SECONDS_PER_DAY
