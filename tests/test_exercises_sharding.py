"""check_zero1_step (chapter 11) accepts the solution and rejects the typical wrong ZeRO-1
steps with their hints: no all-gather, summed gradients, unsharded optimizer state."""
import pytest

from ddnb.exercises.sharding import check_zero1_step, reference_zero1
from ddnb.exercises.solutions.sharding import zero1_step


def no_all_gather(flat, grad, state, lr=0.1, momentum=0.9):
    import torch
    import torch.distributed as dist
    from ddnb.compat import reduce_scatter_single

    n, r = dist.get_world_size(), dist.get_rank()
    S = flat.numel() // n
    g = torch.empty(S, dtype=grad.dtype)
    reduce_scatter_single(g, grad)
    m = state.setdefault("momentum", torch.zeros(S, dtype=grad.dtype))
    m.mul_(momentum).add_(g / n)
    flat[r * S:(r + 1) * S] -= lr * m                 # only my shard: the others never arrive


def summed(flat, grad, state, lr=0.1, momentum=0.9):
    import torch
    import torch.distributed as dist
    from ddnb.compat import all_gather_single, reduce_scatter_single

    n, r = dist.get_world_size(), dist.get_rank()
    S = flat.numel() // n
    g = torch.empty(S, dtype=grad.dtype)
    reduce_scatter_single(g, grad)                    # the sum, never divided by n
    m = state.setdefault("momentum", torch.zeros(S, dtype=grad.dtype))
    m.mul_(momentum).add_(g)
    all_gather_single(flat, flat[r * S:(r + 1) * S] - lr * m)


def unsharded(flat, grad, state, lr=0.1, momentum=0.9):   # plain data parallelism: all-reduce, step everything
    import torch
    import torch.distributed as dist

    g = grad.clone()
    dist.all_reduce(g)
    m = state.setdefault("momentum", torch.zeros_like(flat))
    m.mul_(momentum).add_(g / dist.get_world_size())
    flat -= lr * m


MOMENTUM = {}


def momentum_in_a_global(flat, grad, state, lr=0.1, momentum=0.9):   # the full momentum, outside `state`
    import torch
    import torch.distributed as dist

    g = grad.clone()
    dist.all_reduce(g)
    m = MOMENTUM.setdefault("m", torch.zeros_like(flat))
    m.mul_(momentum).add_(g / dist.get_world_size())
    flat -= lr * m


def shard_in_a_default(flat, grad, state, lr=0.1, momentum=0.9, _kept={}):   # the shard, outside `state`
    import torch
    import torch.distributed as dist
    from ddnb.compat import all_gather_single, reduce_scatter_single

    n, r = dist.get_world_size(), dist.get_rank()
    S = flat.numel() // n
    g = torch.empty(S, dtype=grad.dtype)
    reduce_scatter_single(g, grad)
    m = _kept.setdefault("momentum", torch.zeros(S, dtype=grad.dtype))
    m.mul_(momentum).add_(g / n)
    all_gather_single(flat, flat[r * S:(r + 1) * S] - lr * m)


def torch_sgd_shard(flat, grad, state, lr=0.1, momentum=0.9):   # torch's SGD on my shard: also right
    import torch
    import torch.distributed as dist
    from ddnb.compat import all_gather_single, reduce_scatter_single

    n, r = dist.get_world_size(), dist.get_rank()
    S = flat.numel() // n
    if "opt" not in state:
        state["shard"] = torch.nn.Parameter(flat[r * S:(r + 1) * S].clone())
        state["opt"] = torch.optim.SGD([state["shard"]], lr=lr, momentum=momentum)
    g = torch.empty(S, dtype=grad.dtype)
    reduce_scatter_single(g, grad)
    state["shard"].grad = g / n
    state["opt"].step()
    all_gather_single(flat, state["shard"].detach())


@pytest.mark.parametrize("n", [2, 4])
def test_accepts_the_solution_on_two_world_sizes(n):
    assert check_zero1_step(zero1_step, world_size=n).startswith(f"✓ check_zero1_step: {n} and 3 processes")


def test_accepts_torch_sgd_on_the_shard():   # its momentum (5) counts; the shard's parameters it steps do not
    assert "each rank keeps its shard's 5 elements of optimizer state" in check_zero1_step(torch_sgd_shard)


@pytest.mark.parametrize("fn, where", [(momentum_in_a_global, "20 element\\(s\\) in global 'MOMENTUM'"),
                                       (shard_in_a_default, "5 element\\(s\\) in default argument '_kept'")])
def test_rejects_state_kept_outside_state(fn, where):
    with pytest.raises(AssertionError, match=rf"^4 ranks, step 0: rank 0 keeps {where}, outside `state`\. The "
                                             rf"checker builds your function afresh for every step"):
        check_zero1_step(fn)
    assert MOMENTUM == {}


def test_reference_moves_the_parameters():
    from ddnb.exercises.sharding import _initial

    assert not reference_zero1(4, 20, 3, 0.1, 0.9).allclose(_initial(20))


@pytest.mark.parametrize("fn, hint", [(lambda flat, grad, state, lr, momentum: None, "the parameters are unchanged"),
                                      (no_all_gather, "did the all-gather run?"),
                                      (summed, "off by a factor of N = 4"),
                                      (unsharded, "the optimizer state is not sharded")])
def test_rejects_wrong_steps_with_their_hint(fn, hint):
    with pytest.raises(AssertionError, match=hint):
        check_zero1_step(fn, world_size=4)


def test_bad_arguments_named_together():
    with pytest.raises(ValueError) as e:
        check_zero1_step(zero1_step, world_size=1, steps=0, lr=-1)
    assert "world_size" in str(e.value) and "steps" in str(e.value) and "lr" in str(e.value)
