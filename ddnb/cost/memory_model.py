"""How many bytes training a GPT-style transformer needs: model states, activations, data.

    training_memory(n_layers, d_model, n_heads, vocab_size, seq_len, batch_size, precision)
        -> {"parameters", "gradients", "optimizer", "activations"} in bytes
    layer_activation_bytes(seq_len, batch_size, d_model, n_heads, bytes_per_element, dropout)
    max_params(memory_bytes, precision, optimizer)     model states alone must fit
    dataset_bytes(num_tokens, bytes_per_token)         what the tokens take on disk

Model states (Rajbhandari et al. 2020, "ZeRO", Sec. 3.1): with mixed-precision Adam a
parameter costs 2 bytes (fp16/bf16 weights) + 2 (its gradient) + K = 12 (fp32 master
weights, momentum and variance): 16·Ψ bytes for Ψ parameters. In plain fp32 it is
4 + 4 + 8 = 16 bytes too; mixed precision saves on activations and speed, not on states.

Activations (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", Sec. 4.1, Eq. 1): with sequence length s, batch b, width h and a
heads, one layer keeps, in 16-bit with dropout, sbh·(34 + 5·a·s/h) bytes:
    attention: LayerNorm input 2sbh, QKV input 2sbh, Q, K 4sbh, V 2sbh, softmax output
      2as²b, its dropout mask as²b and output 2as²b, projection input 2sbh, mask sbh;
    MLP: LayerNorm input 2sbh, first linear input 2sbh, GeLU input 8sbh, second linear
      input 8sbh, dropout mask sbh.
In elements that is 16·sbh + a·s²·b tensors of `bytes_per_element` each, plus, with
dropout, 2·sbh + a·s²·b one-byte masks and the a·s²·b dropped-out scores. Outside the
layers (Sec. 4.2): the final LayerNorm and output projection inputs (2·sbh elements),
the logits kept in fp32 for the cross-entropy (4·sbv bytes), and the embedding dropout
mask (sbh bytes). `ddnb.models.gpt` has no dropout and is trained here in fp32:
`training_memory(..., precision="fp32", dropout=False, tied_embeddings=False)` is its
formula, checked against `ddnb.memory`'s measurement in `tests/test_cost_memory_model.py`.
Taught in `notebooks/01_why_distributed.ipynb`.
"""
from __future__ import annotations

from ddnb._checks import Checks, check_positive_ints
from ddnb.cost.transformer import transformer_params

# bytes per parameter of (parameters, gradients, optimizer state): Rajbhandari et al. 2020, Sec. 3.1
STATE_BYTES = {
    ("fp32", "adam"): (4, 4, 8),        # fp32 weights and grads; Adam's momentum and variance
    ("fp32", "momentum"): (4, 4, 4),    # SGD with momentum: one buffer
    ("fp32", "sgd"): (4, 4, 0),
    ("mixed", "adam"): (2, 2, 12),      # 16-bit weights and grads; fp32 master copy + Adam: K = 12
    ("mixed", "momentum"): (2, 2, 8),   # fp32 master copy + momentum
    ("mixed", "sgd"): (2, 2, 4),        # fp32 master copy
}
ACTIVATION_BYTES = {"fp32": 4, "mixed": 2}   # activations are kept in the compute precision
PRECISIONS = tuple(ACTIVATION_BYTES)
OPTIMIZERS = ("adam", "momentum", "sgd")


def state_bytes_per_param(precision: str = "mixed", optimizer: str = "adam") -> tuple[int, int, int]:
    """(parameter, gradient, optimizer) bytes per parameter: mixed-precision Adam (2, 2, 12),
    fp32 Adam (4, 4, 8) (Rajbhandari et al. 2020, Sec. 3.1)."""
    with Checks("state_bytes_per_param") as check:
        check.choice("precision", precision, PRECISIONS)
        check.choice("optimizer", optimizer, OPTIMIZERS)
    return STATE_BYTES[(precision, optimizer)]


def layer_activation_bytes(seq_len: int, batch_size: int, d_model: int, n_heads: int,
                           bytes_per_element: int = 2, dropout: bool = True) -> int:
    """Bytes one transformer layer keeps for backward (Korthikanti et al. 2022, Sec. 4.1):
    e·(16·sbh + a·s²·b), plus (2·sbh + a·s²·b) mask bytes and e·a·s²·b dropped-out scores
    with dropout. e = 2 with dropout is the paper's sbh·(34 + 5·a·s/h)."""
    check_positive_ints("layer_activation_bytes", seq_len=seq_len, batch_size=batch_size, d_model=d_model,
                        n_heads=n_heads, bytes_per_element=bytes_per_element)
    s, b, h, a, e = seq_len, batch_size, d_model, n_heads, bytes_per_element
    total = e * (16 * s * b * h + a * s * s * b)
    if dropout:
        total += 2 * s * b * h + a * s * s * b + e * a * s * s * b
    return total


def head_activation_bytes(seq_len: int, batch_size: int, d_model: int, vocab_size: int,
                          bytes_per_element: int = 2, dropout: bool = True) -> int:
    """Bytes kept outside the layers (Korthikanti et al. 2022, Sec. 4.2): the final
    LayerNorm's and the output projection's inputs e·2·sbh, the logits in fp32 for the
    cross-entropy 4·sbv, and the embedding dropout mask sbh (with dropout)."""
    check_positive_ints("head_activation_bytes", seq_len=seq_len, batch_size=batch_size, d_model=d_model,
                        vocab_size=vocab_size, bytes_per_element=bytes_per_element)
    s, b, h, v, e = seq_len, batch_size, d_model, vocab_size, bytes_per_element
    return e * 2 * s * b * h + 4 * s * b * v + (s * b * h if dropout else 0)


def training_memory(n_layers: int, d_model: int, n_heads: int, vocab_size: int, seq_len: int, batch_size: int,
                    precision: str = "mixed", optimizer: str = "adam", mlp_ratio: int = 4,
                    tied_embeddings: bool = True, dropout: bool = True) -> dict:
    """Bytes of one device training a GPT-style model without any parallelism:
    {"parameters", "gradients", "optimizer", "activations"} (the keys of
    `ddnb.memory.model_memory` plus activations, so `ddnb.viz.plot_memory` draws either).
    Ψ = `transformer_params(...)`; states Ψ·`state_bytes_per_param(precision, optimizer)`;
    activations n_layers·`layer_activation_bytes` + `head_activation_bytes`, at the peak
    (end of forward), without recomputation. Mixed-precision Adam is 16·Ψ + activations."""
    with Checks("training_memory") as check:
        sizes_ok = check.positive_ints(n_layers=n_layers, d_model=d_model, n_heads=n_heads, vocab_size=vocab_size,
                                       seq_len=seq_len, batch_size=batch_size, mlp_ratio=mlp_ratio)
        check.choice("precision", precision, PRECISIONS)
        check.choice("optimizer", optimizer, OPTIMIZERS)
        if sizes_ok:
            check.rule(d_model % n_heads == 0, f"d_model({d_model}) must be divisible by n_heads({n_heads}): "
                       f"each head gets d_model / n_heads = {d_model / n_heads:g} channels")
    num_params = transformer_params(n_layers, d_model, vocab_size, seq_len, mlp_ratio, tied_embeddings)
    p, g, o = state_bytes_per_param(precision, optimizer)
    e = ACTIVATION_BYTES[precision]
    activations = (n_layers * layer_activation_bytes(seq_len, batch_size, d_model, n_heads, e, dropout)
                   + head_activation_bytes(seq_len, batch_size, d_model, vocab_size, e, dropout))
    return {"parameters": p * num_params, "gradients": g * num_params, "optimizer": o * num_params,
            "activations": activations}


def max_params(memory_bytes: float, precision: str = "mixed", optimizer: str = "adam") -> int:
    """The most parameters whose states alone fit in `memory_bytes` (activations need more):
    80 GB / 16 bytes = 5e9 parameters with Adam in either precision."""
    with Checks("max_params") as check:
        check.number("memory_bytes", memory_bytes, positive=True)
        check.choice("precision", precision, PRECISIONS)
        check.choice("optimizer", optimizer, OPTIMIZERS)
    return int(memory_bytes // sum(state_bytes_per_param(precision, optimizer)))


def token_bytes(vocab_size: int) -> int:
    """Bytes of one stored token id: the smallest unsigned integer holding vocab_size ids
    (1 up to 256, 2 up to 65,536 (GPT-2's 50,257), else 4 (Llama 3's 128,256))."""
    check_positive_ints("token_bytes", vocab_size=vocab_size)
    return 1 if vocab_size <= 2 ** 8 else 2 if vocab_size <= 2 ** 16 else 4


def dataset_bytes(num_tokens: float, bytes_per_token: float) -> float:
    """num_tokens · bytes_per_token: a corpus on disk, tokenized (`token_bytes`) or as text
    (about 4 characters of English, so ~4 bytes of UTF-8, per BPE token: OpenAI's
    tokenizer documentation)."""
    with Checks("dataset_bytes") as check:
        check.positive_numbers(num_tokens=num_tokens, bytes_per_token=bytes_per_token)
    return float(num_tokens) * bytes_per_token
