"""The chapters' checkers: each accepts the stored solution and rejects a typical wrong
answer with the hint it promises."""
import pytest

from ddnb.exercises.data_parallel import check_comm_hook
from ddnb.exercises.pipeline import check_1f1b
from ddnb.exercises.predict import check_prediction
from ddnb.exercises.solutions.data_parallel import mean_allreduce_hook
from ddnb.exercises.solutions.pipeline import one_f_one_b
from ddnb.exercises.solutions.tensor_parallel import column_parallel_linear
from ddnb.exercises.tensor_parallel import check_column_parallel
from ddnb.pipeline_parallel import get_schedule


def test_check_prediction():
    assert check_prediction(12, 12, what="bytes", rel_tol=0).startswith("✓")
    assert check_prediction(0.52, 0.5, what="bubble")
    with pytest.raises(AssertionError, match=r"bubble: you predicted 0.75, the answer is 0.272727 \(2.75x the "
                                             r"answer\)\. m micro-batches"):
        check_prediction(0.75, 3 / 11, what="bubble", why="m micro-batches shrink it to (p-1)/(m+p-1)")
    with pytest.raises(ValueError, match=r"predicted=None: write your prediction as a number"):
        check_prediction(None, 1.0, what="x")


def test_check_1f1b_accepts_the_solution_and_ddnb_schedule():
    assert check_1f1b(one_f_one_b, stages=4, microbatches=6).startswith("✓ check_1f1b")
    assert check_1f1b(lambda p, m: get_schedule("1f1b", p, m), stages=3, microbatches=2)


def test_check_1f1b_rejects_gpipe_and_a_deadlock():
    with pytest.raises(AssertionError, match=r"stage 0 holds the activations of 6 micro-batches at once, 1F1B "
                                             r"holds at most 4: it runs 6 forwards before its first backward"):
        check_1f1b(lambda p, m: get_schedule("gpipe", p, m), stages=4, microbatches=6)

    with pytest.raises(AssertionError, match=r"invalid pipeline schedule|Hint: a stage can run B\(j\)"):
        check_1f1b(lambda p, m: [["B0", "F0"] + [f"F{j}" for j in range(1, m)] + [f"B{j}" for j in range(1, m)]
                                 for _ in range(p)], stages=2, microbatches=2)


def test_check_column_parallel():
    assert check_column_parallel(column_parallel_linear, world_size=3).startswith("✓")

    def local_only(x, w, b):
        return x @ w.T + b

    with pytest.raises(AssertionError, match=r"rank 0 returned only its own columns \[0, 1\]: all-gather"):
        check_column_parallel(local_only, world_size=3)

    def summed(x, w, b):
        import torch
        import torch.distributed as dist

        y = x @ w.T + b
        out = torch.zeros(x.shape[0], w.shape[0] * dist.get_world_size(), dtype=x.dtype)
        out[:, :w.shape[0]] = y
        dist.all_reduce(out)
        return out

    with pytest.raises(AssertionError, match=r"concatenated, not summed"):
        check_column_parallel(summed, world_size=3)


def test_check_comm_hook():
    assert check_comm_hook(mean_allreduce_hook, world_size=3).startswith("✓")

    def sum_hook(state, bucket):
        import torch.distributed as dist

        return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda f: f.value()[0])

    with pytest.raises(AssertionError, match=r"every gradient is the sum, not the mean"):
        check_comm_hook(sum_hook, world_size=3)

    def no_comm_hook(state, bucket):
        import torch

        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    with pytest.raises(AssertionError, match=r"rank 0 kept its own gradient"):
        check_comm_hook(no_comm_hook, world_size=3)
