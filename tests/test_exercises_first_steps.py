"""check_sum_over_ranks (chapter 00) accepts the solution and rejects typical wrong answers
with the hint it promises, naming the rank."""
import pytest

from ddnb.exercises.first_steps import check_sum_over_ranks
from ddnb.exercises.solutions.first_steps import total_over_ranks


def own_value(value):                    # no communication at all
    return value


def mean_of_values(value):
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(value)])
    dist.all_reduce(t)
    return t / dist.get_world_size()


def sum_of_ranks(value):                 # reduces the rank, not the value
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    return t.item()


def test_accepts_the_solution():
    assert check_sum_over_ranks(total_over_ranks, world_size=4).startswith("✓ check_sum_over_ranks: every rank "
                                                                           "returned the sum 36")
    assert check_sum_over_ranks(total_over_ranks, world_size=1)


@pytest.mark.parametrize("fn, hint", [
    (own_value, r"rank 0 \(value 3\) returned 3, expected the sum 36\. rank 0 returned its own value"),
    (mean_of_values, r"rank 0 \(value 3\) returned 9, expected the sum 36\. that is the mean"),
    (sum_of_ranks, r"returned 10, expected the sum 36\. that is the sum of the ranks \(or rank \+ 1\)"),
])
def test_rejects_wrong_answers_with_a_hint(fn, hint):
    with pytest.raises(AssertionError, match=hint):
        check_sum_over_ranks(fn, world_size=4)


def test_refuses_bad_arguments():
    with pytest.raises(ValueError, match=r"fn=3: need a function.*world_size=0"):
        check_sum_over_ranks(3, world_size=0)
