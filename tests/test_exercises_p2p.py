"""check_ring_shift and check_broadcast (chapter 03) accept the solutions on two world
sizes, refuse the library's collectives (dist.broadcast, ddnb's tree broadcast, an
all-gather for the pass) with the hint that the messages are the exercise, reject typical
wrong answers with their hints naming the rank (comparing whole tensors), and count the
bytes sent; a ring of blocking sends is named as a deadlock instead of hanging."""
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


def last_element_lost(tensor):           # right but for the last element: beyond a 64-element sample
    inbox = ring_shift(tensor)
    if inbox.numel() > 64:
        inbox[-1] = 0
    return inbox


def sends_both_ways(tensor):             # right values, twice the bytes: also sends to the left
    import torch
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    inbox, spare = torch.empty_like(tensor), torch.empty_like(tensor)
    for h in (dist.irecv(inbox, (rank - 1) % n), dist.isend(tensor, (rank + 1) % n),
              dist.irecv(spare, (rank + 1) % n), dist.isend(tensor, (rank - 1) % n)):
        h.wait()
    return inbox


def shift_by_all_gather(tensor):         # a collective moves everything everywhere: refused
    import torch
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    everyone = [torch.empty_like(tensor) for _ in range(n)]
    dist.all_gather(everyone, tensor)
    return everyone[(rank - 1) % n]


def torch_broadcast(tensor, root):
    import torch.distributed as dist

    dist.broadcast(tensor, root)


def ddnb_broadcast(tensor, root):
    from ddnb.collectives import broadcast as tree_broadcast

    tree_broadcast(tensor, root)


def binomial_tree(tensor, root):         # a tree from isend/irecv: N-1 messages of S too, accepted
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    me, step = (rank - root) % n, 1
    while step < n:
        if me < step and me + step < n:
            dist.send(tensor, (me + step + root) % n)
        elif step <= me < 2 * step:
            dist.recv(tensor, (me - step + root) % n)
        step *= 2


def always_from_rank_0(tensor, root):
    broadcast(tensor, 0)


def root_only(tensor, root):             # nobody sends, nobody receives: nothing blocks, nothing arrives
    return None


def sends_twice(tensor, root):           # right values, 2(N-1)·S bytes
    broadcast(tensor, root)
    broadcast(tensor, root)


def test_ring_shift_accepts_the_solution():
    assert check_ring_shift(ring_shift, world_size=4).startswith(
        "✓ check_ring_shift: every rank holds its left neighbour's whole tensor on 4 and 3 processes")
    assert "on 2 and 3 processes" in check_ring_shift(ring_shift, world_size=2, sizes=(3,))


@pytest.mark.parametrize("fn, hint", [
    (from_the_right, r"^4-rank ring pass of 1 element\(s\) on rank 0, element 0: expected 4000, got 2000\. rank 0 "
                     r"holds rank 1's values: it received from its right"),
    (returns_what_it_sent, r"on rank 0, element 0: expected 4000, got 1000\. rank 0 returned its own tensor"),
    (lambda tensor: tensor, r"on rank 0, element 0: expected 4000, got 1000\. rank 0 returned its own tensor"),
    (last_element_lost, r"^4-rank ring pass of 100 element\(s\) on rank 0, element 99: expected 4099, got 0\."),
])
def test_ring_shift_rejects_wrong_answers_with_a_hint(fn, hint):
    with pytest.raises(AssertionError, match=hint):
        check_ring_shift(fn, world_size=4, sizes=(1, 100))


def test_ring_shift_refuses_a_collective():
    with pytest.raises(AssertionError, match=r"raised on rank 0: .*Refused: dist\.all_gather is off in this exercise: "
                                             r"send with isend \(or send\) and receive with irecv"):
        check_ring_shift(shift_by_all_gather, world_size=4, sizes=(3,))


def test_ring_shift_counts_the_bytes_each_rank_sends():
    with pytest.raises(AssertionError, match=r"^4-rank ring pass of 3 element\(s\): the values are right, but rank 0 "
                                             r"sent 24 bytes \(\{1: 1, 3: 1\} messages per destination\); a ring "
                                             r"pass sends its tensor once, 12 bytes"):
        check_ring_shift(sends_both_ways, world_size=4, sizes=(3,))


def test_ring_shift_names_a_deadlock():
    with pytest.raises(AssertionError, match=r"did not finish within 3 s on rank\(s\) \[0, 1, 2, 3\]: a deadlock\?"):
        check_ring_shift(blocking_sends_first, world_size=4, timeout=3)
    assert check_ring_shift(ring_shift, world_size=4, sizes=(2,))       # a fresh world replaces the killed one


@pytest.mark.parametrize("fn", [broadcast, binomial_tree])
def test_broadcast_accepts_linear_and_tree_broadcasts_from_messages(fn):
    assert check_broadcast(fn, world_size=4).startswith(
        "✓ check_broadcast: every rank holds the root's tensor on 4 and 3 processes, roots 0 and N // 2")


@pytest.mark.parametrize("fn, name", [(torch_broadcast, "dist.broadcast"),
                                      (ddnb_broadcast, "ddnb.collectives.broadcast")])
def test_broadcast_refuses_the_library_broadcast(fn, name):
    with pytest.raises(AssertionError, match=rf"raised on rank 0: .*Refused: {name} is off in this exercise: send the "
                                             rf"root's tensor with isend/send and receive it with irecv/recv"):
        check_broadcast(fn, world_size=4)


@pytest.mark.parametrize("fn, hint", [
    (always_from_rank_0, r"^4-rank broadcast of 1 element\(s\) from root 2 on rank 0, element 0: expected 3000, got "
                         r"1000\. every rank holds rank 0's values: broadcast from `root` \(2\)"),
    (root_only, r"from root 0 on rank 1, element 0: expected 1000, got 2000\. rank 1 still holds its own values"),
    (sends_twice, r"^4-rank broadcast of 1 element\(s\) from root 0: the values are right, but the ranks sent 24 "
                  r"bytes in all \(\[24, 0, 0, 0\] per rank\).*\(N-1\)·S = 12"),
])
def test_broadcast_rejects_wrong_answers_with_a_hint(fn, hint):
    with pytest.raises(AssertionError, match=hint):
        check_broadcast(fn, world_size=4)


def test_refuse_bad_arguments():
    with pytest.raises(ValueError, match=r"fn=1: need a function.*world_size=1.*sizes\[0\]=0"):
        check_ring_shift(1, world_size=1, sizes=(0,))
    with pytest.raises(ValueError, match=r"roots=\(3,\): need ranks in 0..2"):
        check_broadcast(broadcast, world_size=4, roots=(3,))
