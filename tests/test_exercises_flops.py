"""check_flops_per_token (chapter 01) accepts the solution and ddnb.cost's formula (both
equal to torch's FLOP counter) and rejects typical wrong counts with their hints."""
import pytest

from ddnb.cost import flops_per_token
from ddnb.exercises.flops import check_flops_per_token, measured_flops_per_token
from ddnb.exercises.solutions import flops as solution


def test_measured_is_torch_counter_and_ddnb_formula():
    assert measured_flops_per_token(2, 64, 4, 64, 64) == flops_per_token(2, 64, 64, 64) == 712_704


@pytest.mark.parametrize("fn", [solution.flops_per_token, flops_per_token])
def test_accepts_correct_answers(fn):
    assert check_flops_per_token(fn).startswith("✓ check_flops_per_token: equal to torch's FLOP counter")


@pytest.mark.parametrize("fn, hint", [
    (lambda L, d, V, T: 6 * (12 * L * d * d + V * d), r"you computed 614,400 \(0.862x\)\. you left out attention"),
    (lambda L, d, V, T: 2 * (12 * L * d * d + V * d) + 4 * L * T * d, r"\(0.333x\)\. that is the forward pass only"),
    (lambda L, d, V, T: 6 * 12 * L * d * d + 12 * L * T * d, r"you left out the output projection"),
    (lambda L, d, V, T: 6 * (12 * L * d * d + 2 * V * d + T * d) + 12 * L * T * d, r"leave the \(V \+ T\)·d embeddings"),
])
def test_rejects_wrong_counts_with_a_hint(fn, hint):
    with pytest.raises(AssertionError, match=r"n_layers=2, d_model=64, vocab_size=64, seq_len=64: torch counts "
                                             r"712,704 FLOPs per token.*" + hint):
        check_flops_per_token(fn)


def test_refuses_a_non_function():
    with pytest.raises(ValueError, match=r"fn=None: need a function"):
        check_flops_per_token(None)
