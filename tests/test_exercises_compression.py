"""The compression chapter's checkers accept the solutions and reject typical wrong
answers with the hint they promise; the top-k checker refuses ddnb's own top-k and an
all-reduce, and a dense all-gather on what it hands over."""
import pytest
import torch

from ddnb.exercises import check_accumulation_calls, check_powersgd_bytes, check_topk_error_feedback
from ddnb.exercises.solutions import compression as solutions


def library_topk(grad, error, k):                  # ddnb.compression.topk's pieces: refused
    import torch.distributed as dist

    from ddnb.compression.comm import allgather
    from ddnb.compression.topk import topk_compress, topk_decompress

    a = grad + error
    idx, val = topk_compress(a, k)
    new_error = a.clone()
    new_error[idx.long()] = 0
    return topk_decompress(allgather(idx), allgather(val), a.numel()) / dist.get_world_size(), new_error


def no_feedback(grad, error, k):                   # ignores the error it is given
    mean, new_error = solutions.topk_error_feedback(grad, torch.zeros_like(error), k)
    return mean, new_error


def sums(grad, error, k):                          # forgets to divide by N
    import torch.distributed as dist

    mean, new_error = solutions.topk_error_feedback(grad, error, k)
    return mean * dist.get_world_size(), new_error


def largest_not_magnitude(grad, error, k):         # top-k of a, not |a|
    import torch.distributed as dist

    a = grad + error
    idx = a.topk(k).indices
    out = torch.zeros_like(a)
    vals = [torch.empty(k) for _ in range(dist.get_world_size())]
    ids = [torch.empty_like(idx) for _ in range(dist.get_world_size())]
    dist.all_gather(ids, idx)
    dist.all_gather(vals, a[idx].contiguous())
    for i, v in zip(ids, vals):
        out.index_add_(0, i, v)
    err = a.clone()
    err[idx] = 0
    return out / dist.get_world_size(), err


def dense_all_gather(grad, error, k):             # right values, but every rank gathers the dense gradient
    import torch.distributed as dist

    a = grad + error
    n = dist.get_world_size()
    everyone = [torch.empty_like(a) for _ in range(n)]
    dist.all_gather(everyone, a)
    mean = torch.zeros_like(a)
    for other in everyone:
        idx = other.abs().topk(k).indices
        mean[idx] += other[idx]
    new_error = a.clone()
    new_error[a.abs().topk(k).indices] = 0
    return mean / n, new_error


def dense_all_reduce(grad, error, k):              # densify and all-reduce: refused
    import torch.distributed as dist

    a = grad + error
    idx = a.abs().topk(k).indices
    dense = torch.zeros_like(a)
    dense[idx] = a[idx]
    dist.all_reduce(dense)
    new_error = a.clone()
    new_error[idx] = 0
    return dense / dist.get_world_size(), new_error


def zero_error(grad, error, k):                    # throws away what it did not send
    mean, _ = solutions.topk_error_feedback(grad, error, k)
    return mean, torch.zeros_like(grad)


def test_topk_checker_accepts_the_solution_on_two_world_sizes():
    assert check_topk_error_feedback(solutions.topk_error_feedback).startswith(
        "✓ check_topk_error_feedback: 3 steps on 3 and 4 processes, k=4 of 40")
    assert "on 2 and 3 processes, k=3 of 17" in check_topk_error_feedback(solutions.topk_error_feedback,
                                                                          world_size=2, numel=17, k=3)


@pytest.mark.parametrize("fn, name", [(library_topk, "ddnb.compression.topk.topk_compress"),
                                      (dense_all_reduce, "dist.all_reduce")])
def test_topk_checker_refuses_the_shortcuts(fn, name):
    with pytest.raises(AssertionError, match=rf"raised on rank 0: .*Refused: {name} is off in this exercise: "
                                             rf"all-gather every rank's \(indices, values\) with dist\.all_gather"):
        check_topk_error_feedback(fn)


def test_topk_checker_counts_what_is_all_gathered():
    with pytest.raises(AssertionError, match=r"^3 ranks, step 0: the values are right, but rank 0: it handed 40 "
                                             r"elements to the all-gathers; top-k sends k indices and k values, "
                                             r"2k = 8; that is the dense tensor"):
        check_topk_error_feedback(dense_all_gather)


@pytest.mark.parametrize("fn, hint", [
    (lambda grad, error, k: (grad, error), "rank 0 returned its own grad + error, dense"),
    (sums, "N times the mean"),
    (largest_not_magnitude, "the k largest |a| (magnitude"),
    (zero_error, "the error is zero"),
])
def test_topk_checker_rejects_with_hint(fn, hint):
    with pytest.raises(AssertionError) as e:
        check_topk_error_feedback(fn)
    assert hint in str(e.value) and "on rank" in str(e.value)


def test_topk_checker_names_missing_feedback():
    with pytest.raises(AssertionError, match="3 ranks, step 1: the mean on rank 0.*without\\* error feedback"):
        check_topk_error_feedback(no_feedback)


def test_powersgd_bytes_checker():
    assert "12288 bytes" in check_powersgd_bytes(solutions.powersgd_bytes_512x256_rank4)
    with pytest.raises(AssertionError, match="that is elements: each is a 4-byte float"):
        check_powersgd_bytes((512 + 256) * 4)
    with pytest.raises(AssertionError, match="that is P alone"):
        check_powersgd_bytes(512 * 4 * 4)
    with pytest.raises(AssertionError, match="that is the uncompressed gradient"):
        check_powersgd_bytes(512 * 256 * 4)


def test_accumulation_checker():
    assert "6 calls" in check_accumulation_calls(solutions.accumulation_calls_192_8_4)
    with pytest.raises(AssertionError, match="one call per micro-batch: under no_sync"):
        check_accumulation_calls(24)
    with pytest.raises(ValueError, match="answer='six': need a number"):
        check_accumulation_calls("six")
