"""Checker for the compute chapter (01): the learner's model FLOPs per training token of a
GPT, against what PyTorch's FLOP counter (`torch.utils.flop_counter.FlopCounterMode`)
measures on a forward and backward of `ddnb.models.gpt` (Kaplan et al. 2020, Sec. 2.1:
6·N per token; Chowdhery et al. 2022, PaLM, App. B: + 12·L·T·d for attention).
Taught in `notebooks/01_why_distributed.ipynb`.

    check_flops_per_token(my_flops_per_token)   # my_flops_per_token(n_layers, d_model, vocab_size, seq_len)
"""
from __future__ import annotations

from ddnb._checks import Checks
from ddnb.exercises.core import passed

# (n_layers, d_model, n_heads, vocab_size, seq_len): small, and each term differs between them
CONFIGS = ((2, 64, 4, 64, 64), (1, 32, 2, 16, 16), (3, 48, 4, 40, 24))


def measured_flops_per_token(n_layers: int, d_model: int, n_heads: int, vocab_size: int, seq_len: int,
                             batch_size: int = 2) -> int:
    """FLOPs torch counts for one forward + backward of ddnb's GPT, per token."""
    from torch.utils.flop_counter import FlopCounterMode

    from ddnb.models import GPTConfig, gpt, lm_loss, synthetic_task

    cfg = GPTConfig(vocab_size=vocab_size, seq_len=seq_len, d_model=d_model, n_heads=n_heads, n_layers=n_layers)
    idx, targets = synthetic_task(cfg, batch_size=batch_size, steps=1)[0]       # (B, T) each
    with FlopCounterMode(display=False) as counter:
        lm_loss(gpt(cfg, seed=0)(idx), targets).backward()
    return counter.get_total_flops() // (batch_size * seq_len)


def diagnose_flops(got: float, L: int, d: int, V: int, T: int) -> str:
    """What a wrong count usually means (the hint of `check_flops_per_token`)."""
    n = 12 * L * d * d + V * d                    # matmul weights: blocks and the output projection
    attn = 12 * L * T * d
    known = {
        2 * n + attn // 3: "that is the forward pass only (2·N + 4·L·T·d): the backward costs twice the forward",
        6 * n: "you left out attention's QKᵀ and AV products, 12·L·T·d per token (forward and backward)",
        6 * 12 * L * d * d + attn: "you left out the output projection (vocab_size·d_model weights) from N",
        6 * (n + (V + T) * d) + attn: "embedding lookups multiply nothing: leave the (V + T)·d embeddings out of N",
        2 * n + 2 * L * T * d: "that is the forward pass only: multiply by 3 for forward + backward",
    }
    for value, hint in known.items():
        if got == value:
            return hint
    return "6·N + 12·L·T·d, with N = 12·L·d² + V·d the weights that multiply activations"


def check_flops_per_token(fn) -> str:
    """Compare `fn(n_layers, d_model, vocab_size, seq_len)` with the FLOPs per token that
    torch's FLOP counter measures on ddnb's GPT for three shapes. Returns the success line,
    else AssertionError naming the shape, the expected and the returned count and a hint."""
    with Checks("check_flops_per_token") as check:
        check.rule(callable(fn), f"fn={fn!r}: need a function fn(n_layers, d_model, vocab_size, seq_len)")
    for L, d, heads, V, T in CONFIGS:
        expected = measured_flops_per_token(L, d, heads, V, T)
        got = fn(L, d, V, T)
        if not isinstance(got, (int, float)) or isinstance(got, bool):
            raise AssertionError(f"fn({L}, {d}, {V}, {T}) returned {got!r}: return a number of FLOPs")
        if abs(got - expected) > 1e-6 * expected:
            raise AssertionError(f"n_layers={L}, d_model={d}, vocab_size={V}, seq_len={T}: torch counts {expected:,} "
                                 f"FLOPs per token, you computed {got:,.0f} ({got / expected:.3g}x). "
                                 f"{diagnose_flops(got, L, d, V, T)}")
    return passed("check_flops_per_token", f"equal to torch's FLOP counter on {len(CONFIGS)} GPT shapes")
