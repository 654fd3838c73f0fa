"""check_remaining_indices (chapter 14, elastic training) accepts the solution and the
library's remaining_indices, and rejects the typical wrong shares with their hints."""
import pytest

from ddnb.elastic.sampler import remaining_indices
from ddnb.exercises.elastic import check_remaining_indices
from ddnb.exercises.solutions.elastic import remaining_share


def whole_order(order, consumed, rank, world_size):          # forgets what was read
    return order[rank::world_size]


def padded(order, consumed, rank, world_size):               # DistributedSampler's padding
    rest = order[consumed:]
    per = -(-len(rest) // world_size)
    rest = rest + rest[:per * world_size - len(rest)]
    return rest[rank::world_size]


def old_stride(order, consumed, rank, world_size):           # resume as if the world had not changed
    return order[rank::world_size][consumed // world_size:]


def dropped(order, consumed, rank, world_size):              # drop_last: the tail is skipped
    rest = order[consumed:]
    return rest[:len(rest) // world_size * world_size][rank::world_size]


def blocks(order, consumed, rank, world_size):               # contiguous blocks: each sample once, not strided
    rest = order[consumed:]
    per = -(-len(rest) // world_size)
    return rest[rank * per:(rank + 1) * per]


@pytest.mark.parametrize("fn", [remaining_share, remaining_indices])
def test_accepts_the_solution_and_the_library(fn):
    assert check_remaining_indices(fn, world_size=3).startswith("✓ check_remaining_indices")


@pytest.mark.parametrize("fn, hint", [
    (whole_order, r"samples read before the resize come again"),
    (padded, r"DistributedSampler's padding"),
    (old_stride, r"own stride of the whole epoch, skipped by consumed / M"),
    (dropped, r"in no share: a dropped tail"),
    (blocks, r"not strided: with blocks"),
])
def test_rejects_typical_wrong_shares_with_their_hint(fn, hint):
    with pytest.raises(AssertionError, match=hint):
        check_remaining_indices(fn, world_size=3)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r"fn=3: need a function.*world_size=0"):
        check_remaining_indices(3, world_size=0)
