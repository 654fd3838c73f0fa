"""Notebook 13's checkers accept the solutions (and ddnb's own merge) and reject typical
wrong answers with their hints."""
import pytest
import torch

from ddnb.context_parallel import merge as ddnb_merge
from ddnb.exercises import check_dropped_tokens, check_merge, check_ulysses_bytes
from ddnb.exercises.solutions import context_parallel as solutions


def test_ulysses_bytes():
    assert check_ulysses_bytes(solutions.ulysses_bytes).startswith("✓ check_ulysses_bytes: 49152 bytes")
    with pytest.raises(AssertionError, match="that is the forward only"):
        check_ulysses_bytes(solutions.ulysses_bytes / 2)
    with pytest.raises(AssertionError, match=r"multiply by \(N-1\)/N"):
        check_ulysses_bytes(4 * 8192 * 2)


def plain_mean(out, lse, block_out, block_lse):
    return (out + block_out) / 2, torch.logaddexp(lse, block_lse)


def max_lse(out, lse, block_out, block_lse):
    new = torch.logaddexp(lse, block_lse)
    return out * torch.exp(lse - new)[..., None] + block_out * torch.exp(block_lse - new)[..., None], \
        torch.maximum(lse, block_lse)


@pytest.mark.parametrize("fn", [solutions.merge, ddnb_merge])
def test_merge_accepts(fn):
    assert check_merge(fn, world_size=2).startswith("✓ check_merge")


def test_merge_rejects():
    with pytest.raises(AssertionError, match="plain mean of the two outputs"):
        check_merge(plain_mean, world_size=2)
    with pytest.raises(AssertionError, match="merged log-sum-exp.*use torch.logaddexp"):
        check_merge(max_lse, world_size=2)


def test_dropped_tokens():
    assert check_dropped_tokens(solutions.dropped).startswith("✓ check_dropped_tokens: capacity 4")
    with pytest.raises(AssertionError, match="that is the number kept"):
        check_dropped_tokens(11)
    with pytest.raises(AssertionError, match=r"capacity counts every one of the top_k=2 choices"):
        check_dropped_tokens(8, top_k=2, capacity_factor=1.0)   # capacity ceil(8/4) = 2 forgets k
