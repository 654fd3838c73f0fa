"""The checkers of notebook 05b accept the solution (and the library's gossip) and reject
typical wrong answers with their hints."""
import pytest
import torch

from ddnb.exercises.decentralized import check_bytes_prediction, check_gossip_step, check_spectral_gap
from ddnb.exercises.solutions import decentralized as solutions


def library_gossip(x, W):
    from ddnb.decentralized import from_matrix, gossip

    return gossip(x, from_matrix(W))


def returns_mean(x, W):                  # an all-reduce, not one gossip step
    import torch.distributed as dist

    y = x.clone()
    dist.all_reduce(y)
    return y / dist.get_world_size()


def transposed(x, W):                    # weighs by the column instead of the row
    return solutions.gossip_step(x, W.T.contiguous())


@pytest.mark.parametrize("fn", [solutions.gossip_step, library_gossip])
def test_check_gossip_step_accepts_correct_answers(fn):
    assert check_gossip_step(fn).startswith("✓ check_gossip_step")


@pytest.mark.parametrize("fn, hint", [
    (lambda x, W: x, r"returned its own x unchanged"),
    (returns_mean, r"every rank holds the exact mean: that is an all-reduce"),
    (transposed, r"weights look transposed\?"),
])
def test_check_gossip_step_rejects_wrong_answers_with_a_hint(fn, hint):
    with pytest.raises(AssertionError, match=hint) as e:
        check_gossip_step(fn, topologies=("exponential",) if fn is transposed else ("ring",))
    assert "on rank" in str(e.value)


def test_check_spectral_gap():
    assert check_spectral_gap(solutions.RING8_GAP).startswith("✓")
    with pytest.raises(AssertionError, match=r"expected 0\.1953, got 0\.8047.*the gap is 1 - \|lambda_2\|"):
        check_spectral_gap(0.8047)
    with pytest.raises(AssertionError, match=r"write a number"):
        check_spectral_gap("small")


def test_check_bytes_prediction():
    numel = 1000
    assert check_bytes_prediction(8000, 6000, n=4, numel=numel,
                                  measured={"dpsgd": 8000, "allreduce": 6000}).endswith("(the trace agrees)")
    with pytest.raises(AssertionError, match=r"dpsgd .* expected 8000, got 4000.*you counted one neighbour"):
        check_bytes_prediction(4000, 6000, n=4, numel=numel)
    with pytest.raises(AssertionError, match=r"allreduce .* expected 6000, got 8000"):
        check_bytes_prediction(8000, 8000, n=4, numel=numel)
    with pytest.raises(AssertionError, match=r"measured dpsgd 9000 B"):
        check_bytes_prediction(8000, 6000, n=4, numel=numel, measured={"dpsgd": 9000, "allreduce": 6000})
