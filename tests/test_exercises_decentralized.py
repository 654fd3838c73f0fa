"""The checkers of notebook 05b: check_gossip_step accepts the solution on two world
sizes, refuses ddnb's gossip and dist.all_reduce, rejects typical wrong answers with their
hints and a step that sends x beyond its neighbours; the predictions' checkers."""
import pytest
import torch

from ddnb.exercises.decentralized import check_bytes_prediction, check_gossip_step, check_spectral_gap
from ddnb.exercises.solutions import decentralized as solutions


def library_gossip(x, W):                # ddnb's own gossip: the shortcut
    from ddnb.decentralized import from_matrix, gossip

    return gossip(x, from_matrix(W))


def allreduce_mean(x, W):                # an all-reduce, not one gossip step: refused
    import torch.distributed as dist

    y = x.clone()
    dist.all_reduce(y)
    return y / dist.get_world_size()


def to_everyone(x, W):                   # sends x to every rank, neighbour or not
    import torch.distributed as dist

    me, n = dist.get_rank(), dist.get_world_size()
    inbox = {j: torch.empty_like(x) for j in range(n) if j != me}
    ops = [dist.P2POp(dist.isend, x, k) for k in range(n) if k != me]
    ops += [dist.P2POp(dist.irecv, buf, j) for j, buf in inbox.items()]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return to_everyone.mix(x, W, me, inbox)


def mean_from_everyone(x, W):            # the exact mean, from p2p messages to everyone
    import torch.distributed as dist

    uniform = torch.full_like(W, 1.0 / dist.get_world_size())
    return to_everyone(x, uniform)


def _mix(x, W, me, inbox):
    out = W[me, me] * x
    for j, buf in inbox.items():
        out = out + W[me, j] * buf
    return out


to_everyone.mix = _mix


def transposed(x, W):                    # weighs by the column instead of the row
    return solutions.gossip_step(x, W.T.contiguous())


def test_check_gossip_step_accepts_the_solution_on_two_world_sizes():
    assert check_gossip_step(solutions.gossip_step).startswith(
        "✓ check_gossip_step: every rank holds its row of W X on 4 and 3 processes")


@pytest.mark.parametrize("fn, name", [(library_gossip, "ddnb.decentralized.gossip"),
                                      (allreduce_mean, "dist.all_reduce")])
def test_check_gossip_step_refuses_the_shortcuts(fn, name):
    with pytest.raises(AssertionError, match=rf"raised on rank 0: .*Refused: {name} is off in this exercise: exchange "
                                             rf"x with the neighbours with isend/irecv"):
        check_gossip_step(fn, topologies=("ring",))


@pytest.mark.parametrize("fn, hint", [
    (lambda x, W: x, r"returned its own x unchanged"),
    (mean_from_everyone, r"every rank holds the exact mean: that is an all-reduce"),
    (transposed, r"weights look transposed\?"),
])
def test_check_gossip_step_rejects_wrong_answers_with_a_hint(fn, hint):
    with pytest.raises(AssertionError, match=hint) as e:
        check_gossip_step(fn, topologies=("exponential",) if fn is transposed else ("ring",))
    assert "on rank" in str(e.value)


def test_check_gossip_step_counts_the_bytes_to_each_neighbour():
    with pytest.raises(AssertionError, match=r"^4-rank gossip on the ring: the values are right, but rank 0 sent "
                                             r"\{1: 56, 2: 56, 3: 56\} bytes per destination; one gossip step sends "
                                             r"x \(56 bytes\) once to each out-neighbour \[1, 3\]: 2·S = 112 bytes"):
        check_gossip_step(to_everyone, topologies=("ring",))
    assert check_gossip_step(to_everyone, world_sizes=(3,), topologies=("ring",))    # on 3 ranks all are neighbours


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
