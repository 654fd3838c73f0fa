"""check_ring_shift and check_broadcast (chapter 03) accept the solutions (and torch's
broadcast) and reject typical wrong answers with their hints; a ring of blocking sends
is named as a deadlock instead of hanging."""
import pytest

from ddnb.exercises.p2p import check_broadcast, check_ring_shift
from ddnb.exercises.solutions.p2p import broadcast, ring_shift


def blocking_sends_first(tensor):        # every rank sends before it receives: a circle of waits
    import torch
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    inbox = torch.empty_like(tensor)
    dist.send(tensor, (rank + 1) % n)
    dist.recv(inbox, (rank - 1) % n)
    return inbox


def from_the_right(tensor):
    import torch
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    inbox = torch.empty_like(tensor)
    for h in (dist.irecv(inbox, (rank + 1) % n), dist.isend(tensor, (rank - 1) % n)):
        h.wait()
    return inbox


def returns_what_it_sent(tensor):
    import torch
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    inbox = torch.empty_like(tensor)
    for h in (dist.irecv(inbox, (rank - 1) % n), dist.isend(tensor, (rank + 1) % n)):
        h.wait()
    return tensor


def torch_broadcast(tensor, root):
    import torch.distributed as dist

    dist.broadcast(tensor, root)


def always_from_rank_0(tensor, root):
    import torch.distributed as dist

    dist.broadcast(tensor, 0)


def root_only(tensor, root):             # the root sends, nobody receives: nothing blocks, nothing arrives
    return None


def test_ring_shift_accepts_the_solution():
    assert check_ring_shift(ring_shift, world_size=4).startswith("✓ check_ring_shift")
    assert check_ring_shift(ring_shift, world_size=2, sizes=(3,))


@pytest.mark.parametrize("fn, hint", [
    (from_the_right, r"ring pass of 1 element\(s\) on rank 0, element 0: expected 4000, got 2000\. rank 0 holds rank "
                     r"1's values: it received from its right"),
    (returns_what_it_sent, r"on rank 0, element 0: expected 4000, got 1000\. rank 0 returned its own tensor"),
])
def test_ring_shift_rejects_wrong_answers_with_a_hint(fn, hint):
    with pytest.raises(AssertionError, match=hint):
        check_ring_shift(fn, world_size=4, sizes=(1,))


def test_ring_shift_names_a_deadlock():
    with pytest.raises(AssertionError, match=r"did not finish within 3 s on rank\(s\) \[0, 1, 2, 3\]: a deadlock\?"):
        check_ring_shift(blocking_sends_first, world_size=4, timeout=3)
    assert check_ring_shift(ring_shift, world_size=4, sizes=(2,))       # a fresh world replaces the killed one


@pytest.mark.parametrize("fn", [broadcast, torch_broadcast])
def test_broadcast_accepts_correct_answers(fn):
    assert check_broadcast(fn, world_size=4).startswith("✓ check_broadcast")


@pytest.mark.parametrize("fn, hint", [
    (always_from_rank_0, r"from root 2 on rank 0, element 0: expected 3000, got 1000\. every rank holds rank 0's "
                         r"values: broadcast from `root` \(2\)"),
    (root_only, r"from root 0 on rank 1, element 0: expected 1000, got 2000\. rank 1 still holds its own values"),
])
def test_broadcast_rejects_wrong_answers_with_a_hint(fn, hint):
    with pytest.raises(AssertionError, match=hint):
        check_broadcast(fn, world_size=4)


def test_refuse_bad_arguments():
    with pytest.raises(ValueError, match=r"fn=1: need a function.*world_size=1.*sizes\[0\]=0"):
        check_ring_shift(1, world_size=1, sizes=(0,))
    with pytest.raises(ValueError, match=r"roots=\(5,\): need ranks in 0..3"):
        check_broadcast(broadcast, world_size=4, roots=(5,))
