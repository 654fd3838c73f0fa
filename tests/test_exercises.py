"""check_allreduce accepts the stored ring (on two world sizes, one not a power of two),
refuses the library's all-reduce (dist.all_reduce, ddnb's ring) with the hint that the
ring is the exercise, rejects a typical wrong answer with the hint it promises naming the
rank, and a gather-to-root all-reduce from isend/irecv on the bytes its root sends."""
import re

import pytest
import torch

from ddnb.exercises import check_allreduce
from ddnb.exercises.solutions import collectives as solutions


def torch_allreduce(tensor):              # the library's all-reduce: the shortcut the exercise refuses
    import torch.distributed as dist

    dist.all_reduce(tensor)


def ddnb_ring_allreduce(tensor):          # ddnb's own ring: the same shortcut
    from ddnb.collectives import ring_allreduce

    ring_allreduce(tensor)


def does_nothing(tensor):
    return tensor


def returns_new_tensor(tensor):          # forgets that the caller's tensor must change
    out = tensor.clone()
    solutions.ring_allreduce(out)
    return out


def reduce_scatter_only(tensor):         # stops after the reduce-scatter phase
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = list(tensor.view(-1).tensor_split(n))
    for step in range(n - 1):
        send_i, recv_i = (rank - step) % n, (rank - step - 1) % n
        incoming = torch.empty_like(chunks[recv_i])
        for req in [dist.isend(chunks[send_i].contiguous(), (rank + 1) % n), dist.irecv(incoming, (rank - 1) % n)]:
            req.wait()
        chunks[recv_i] += incoming


def averages(tensor):
    import torch.distributed as dist

    solutions.ring_allreduce(tensor)
    tensor /= dist.get_world_size()


def gather_to_root(tensor):              # the naive all-reduce from isend/irecv: right sum, not a ring
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        for src in range(1, n):
            incoming = torch.empty_like(tensor)
            dist.recv(incoming, src)
            tensor += incoming
        for req in [dist.isend(tensor, dst) for dst in range(1, n)]:
            req.wait()
    else:
        dist.send(tensor, 0)
        dist.recv(tensor, 0)


def blocking_sends_in_a_circle(tensor):  # every rank sends first: deadlocks for large tensors
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    dist.send(tensor, (rank + 1) % n)
    dist.recv(tensor, (rank - 1) % n)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_check_allreduce_accepts_the_ring_on_two_world_sizes(world_size):
    msg = check_allreduce(solutions.ring_allreduce, world_size=world_size)
    other = 3 if world_size in (1, 2, 4) else 4
    assert msg.startswith(f"✓ check_allreduce: every rank holds the sum on {world_size} and {other} processes")


def test_check_allreduce_runs_3_and_4_ranks_by_default():
    assert "on 3 and 4 processes, sizes [1, 7, 12, 64]" in check_allreduce(solutions.ring_allreduce)


@pytest.mark.parametrize("fn, name", [(torch_allreduce, "dist.all_reduce"),
                                      (ddnb_ring_allreduce, "ddnb.collectives.ring_allreduce")])
def test_check_allreduce_refuses_the_library_all_reduce(fn, name):
    with pytest.raises(AssertionError, match=rf"raised on rank 0: .*Refused: {re.escape(name)} is off in this "
                                             rf"exercise: build it from isend/irecv, that is the exercise"):
        check_allreduce(fn, world_size=3)


def test_the_ranks_get_their_collectives_back_after_a_refusal():
    from ddnb.exercises.core import run_on_ranks

    with pytest.raises(AssertionError, match="Refused"):
        check_allreduce(torch_allreduce, world_size=3, sizes=(2,))
    assert run_on_ranks(library_sum, 3) == [3.0, 3.0, 3.0]       # the same processes: dist.all_reduce works


def library_sum():
    import torch.distributed as dist

    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


@pytest.mark.parametrize("fn, hint", [
    (does_nothing, r"rank 0's tensor is unchanged: write the result into `tensor` in place"),
    (returns_new_tensor, r"rank 0's tensor is unchanged: write the result into `tensor` in place"),
    (reduce_scatter_only, r"rank 0 holds the sum only in one chunk \(elements 4..7\): did the all-gather phase run\?"),
    (averages, r"every element is the mean"),
])
def test_check_allreduce_rejects_wrong_answers_with_a_hint(fn, hint):
    with pytest.raises(AssertionError, match=hint) as e:
        check_allreduce(fn, world_size=3, sizes=(12,))
    assert re.search(r"3-rank all-reduce of 12 element\(s\) on rank 0, element \d+: expected \d+, got \d+",
                     str(e.value))


def test_check_allreduce_rejects_a_gather_to_root_on_its_bytes():
    assert check_allreduce(gather_to_root, world_sizes=(2,), sizes=(12,))   # on 2 ranks it sends what a ring does
    with pytest.raises(AssertionError) as e:
        check_allreduce(gather_to_root, world_size=3, sizes=(12,))
    assert str(e.value) == (
        "3-rank all-reduce of 12 element(s): the sum is right, but rank 0 sent 192 bytes; a ring all-reduce of 12 "
        "element(s) of 8 bytes on 3 ranks sends 2(N-1) = 4 chunks of 4..4 elements, 128..128 bytes per rank and "
        "384 in all (Patarasuk & Yuan 2009): it sent the whole tensor (96 bytes) 2 times: a gather to one rank and "
        "a send back is not a ring; each rank sends only chunks of about S/N to its right")


def test_check_allreduce_names_a_deadlock_instead_of_hanging():
    with pytest.raises(AssertionError, match=r"did not finish within 3 s on rank\(s\) \[0, 1, 2\]: a deadlock\?"):
        check_allreduce(blocking_sends_in_a_circle, world_size=3, sizes=(1 << 22,), timeout=3)
    assert check_allreduce(solutions.ring_allreduce, world_size=3, sizes=(5,))   # a fresh world replaces the killed one


def test_check_allreduce_refuses_bad_arguments_before_running():
    with pytest.raises(ValueError, match=r"fn=3: need a function.*world_size=0.*sizes\[1\]=-2"):
        check_allreduce(3, world_size=0, sizes=(4, -2))
    with pytest.raises(ValueError, match=r"world_sizes=\(3, 9\): need integers >= 1 and <= 8"):
        check_allreduce(solutions.ring_allreduce, world_sizes=(3, 9))


def test_a_success_line_is_printed_once_not_echoed(capsys):
    from ddnb.exercises import check_prediction

    msg = check_prediction(3, 3, what="x", rel_tol=0)
    assert capsys.readouterr().out == "✓ check_prediction: x: 3 matches 3 exactly\n"
    assert msg == "✓ check_prediction: x: 3 matches 3 exactly"
    from IPython.core.interactiveshell import InteractiveShell

    formatter = InteractiveShell.instance().display_formatter
    assert formatter.format(msg) == ({}, {}) and formatter.format(str(msg))[0]   # a plain str would be echoed
