"""Every checker accepts the reference (torch.distributed) and the stored solution, and
rejects a typical wrong answer with the hint it promises, naming the rank."""
import re

import pytest
import torch

from ddnb.exercises import check_allreduce
from ddnb.exercises.solutions import collectives as solutions


def torch_allreduce(tensor):
    import torch.distributed as dist

    dist.all_reduce(tensor)


def returns_new_tensor(tensor):          # forgets that the caller's tensor must change
    import torch.distributed as dist

    out = tensor.clone()
    dist.all_reduce(out)
    return out


def reduce_scatter_only(tensor):         # stops after the reduce-scatter phase
    import torch.distributed as dist

    n, rank = dist.get_world_size(), dist.get_rank()
    full = tensor.clone()
    dist.all_reduce(full)
    mine = torch.arange(tensor.numel()).tensor_split(n)[rank]
    tensor[mine] = full[mine]


def averages(tensor):
    import torch.distributed as dist

    dist.all_reduce(tensor)
    tensor /= dist.get_world_size()


def blocking_sends_in_a_circle(tensor):  # every rank sends first: deadlocks for large tensors
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    dist.send(tensor, (rank + 1) % n)
    dist.recv(tensor, (rank - 1) % n)


@pytest.mark.parametrize("fn", [torch_allreduce, solutions.ring_allreduce])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_check_allreduce_accepts_correct_answers(fn, world_size):
    assert check_allreduce(fn, world_size=world_size).startswith("✓ check_allreduce")


@pytest.mark.parametrize("fn, hint", [
    (returns_new_tensor, r"rank 0's tensor is unchanged: write the result into `tensor` in place"),
    (reduce_scatter_only, r"rank 0 holds the sum only in its own chunk .*did the all-gather phase run\?"),
    (averages, r"every element is the mean"),
])
def test_check_allreduce_rejects_wrong_answers_with_a_hint(fn, hint):
    with pytest.raises(AssertionError, match=hint) as e:
        check_allreduce(fn, world_size=3, sizes=(12,))
    assert re.search(r"on rank 0, element \d+: expected \d+, got \d+", str(e.value))


def test_check_allreduce_names_a_deadlock_instead_of_hanging():
    with pytest.raises(AssertionError, match=r"did not finish within 3 s on rank\(s\) \[0, 1, 2\]: a deadlock\?"):
        check_allreduce(blocking_sends_in_a_circle, world_size=3, sizes=(1 << 22,), timeout=3)
    assert check_allreduce(torch_allreduce, world_size=3, sizes=(5,))   # a fresh world replaces the killed one


def test_check_allreduce_refuses_bad_arguments_before_running():
    with pytest.raises(ValueError, match=r"fn=3: need a function.*world_size=0.*sizes\[1\]=-2"):
        check_allreduce(3, world_size=0, sizes=(4, -2))


def test_a_success_line_is_printed_once_not_echoed(capsys):
    from ddnb.exercises import check_prediction

    msg = check_prediction(3, 3, what="x", rel_tol=0)
    assert capsys.readouterr().out == "✓ check_prediction: x: 3 matches 3 exactly\n"
    assert msg == "✓ check_prediction: x: 3 matches 3 exactly"
    from IPython.core.interactiveshell import InteractiveShell

    formatter = InteractiveShell.instance().display_formatter
    assert formatter.format(msg) == ({}, {}) and formatter.format(str(msg))[0]   # a plain str would be echoed
