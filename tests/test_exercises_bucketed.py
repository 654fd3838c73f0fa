"""check_bucketed (chapter 06): the learner's bucketed, overlapped data parallelism passes
on 3 and 4 processes; the usual mistakes (all-reduce after backward, per-parameter
all-reduces, a blocking all-reduce, no wait, the sum, no copy back, no reset between steps)
fail with their hint naming a rank and step; DDP and BucketedDataParallel are refused.
The wrong answers are defined inside the tests so that they travel to the ranks by value."""
import pytest
import torch

from ddnb.exercises import check_bucketed
from ddnb.exercises.bucketed import buckets, model, reference
from ddnb.exercises.solutions.bucketed import MyBucketSync


def test_buckets_are_three_of_distinct_sizes_in_reverse_order():
    params = list(model().parameters())
    assert buckets() == [[7, 6, 5, 4, 3], [2], [1, 0]]
    assert [sum(params[i].numel() for i in b) for b in buckets()] == [628, 1024, 288]


def test_reference_mean_is_the_mean_of_the_ranks_gradients():
    final, local, mean = reference(3, steps=1)
    assert torch.allclose(mean, sum(local) / 3, atol=1e-6)


def test_accepts_the_solution():
    assert check_bucketed(MyBucketSync).startswith("✓ check_bucketed: 3 buckets, each all-reduced once a step "
                                                    "and the first launched during backward")


def test_refuses_an_all_reduce_of_every_gradient_after_backward():
    import torch.distributed as dist

    class AfterBackward:
        def __init__(self, params, buckets):
            self.params = params

        def finish(self):
            for p in self.params:
                dist.all_reduce(p.grad)
                p.grad /= dist.get_world_size()

    with pytest.raises(AssertionError, match=r"rank 0, step 0: the first all-reduce was launched after backward "
                                             r"produced its last gradient: nothing overlaps backward"):
        check_bucketed(AfterBackward)


def test_refuses_buckets_launched_only_in_finish():
    import torch.distributed as dist

    class BucketsInFinish(MyBucketSync):
        def ready(self, i):
            pass

        def finish(self):
            for k, b in enumerate(self.buckets):
                flat = torch.cat([self.params[j].grad.reshape(-1) for j in b])
                self.launched.append((k, flat, dist.all_reduce(flat, async_op=True)))
            super().finish()

    with pytest.raises(AssertionError, match=r"rank 0, step 0: the first all-reduce was launched after backward"):
        check_bucketed(BucketsInFinish)


def test_refuses_one_all_reduce_per_parameter():
    import torch.distributed as dist

    class PerParameter(MyBucketSync):
        def ready(self, i):
            g = self.params[i].grad
            self.launched.append((i, g, dist.all_reduce(g, async_op=True)))

        def finish(self):
            for _, g, work in self.launched:
                work.wait()
                g /= dist.get_world_size()
            self.launched = []

    with pytest.raises(AssertionError, match=r"rank 0, step 0: all-reduces of \[4, 16, 32, 32, 64, 256, 512, 1024\] "
                                             r"elements; the buckets hold \[288, 628, 1024\]: one all-reduce per "
                                             r"bucket"):
        check_bucketed(PerParameter)


def test_refuses_a_blocking_all_reduce():
    import torch.distributed as dist

    class Blocking(MyBucketSync):
        def ready(self, i):
            k = self.bucket_of[i]
            self.missing[k] -= 1
            if self.missing[k] == 0:
                flat = torch.cat([self.params[j].grad.reshape(-1) for j in self.buckets[k]])
                dist.all_reduce(flat)
                self.launched.append((k, flat, torch.futures.Future()))
                self.launched[-1][2].set_result(None)

    with pytest.raises(AssertionError, match=r"rank 0, step 0: the all-reduce of the bucket of 628 elements was "
                                             r"blocking: launch it with async_op=True"):
        check_bucketed(Blocking)


def test_refuses_a_bucket_never_waited_for():
    import torch.distributed as dist

    class NoWait(MyBucketSync):
        def finish(self):
            for k, flat, work in self.launched:
                flat /= dist.get_world_size()
                offset = 0
                for j in self.buckets[k]:
                    g = self.params[j].grad
                    g.copy_(flat[offset:offset + g.numel()].view_as(g))
                    offset += g.numel()
            self.launched, self.missing = [], [len(b) for b in self.buckets]

    with pytest.raises(AssertionError, match=r"rank 0, step 0: the all-reduce of the bucket of \d+ elements was "
                                             r"never waited for: call work.wait\(\) in finish\(\)"):
        check_bucketed(NoWait)


def test_refuses_no_reset_between_steps():
    class NoReset(MyBucketSync):
        def finish(self):
            missing = self.missing
            super().finish()
            self.missing = missing

    with pytest.raises(AssertionError, match=r"rank 0, step 1: no dist.all_reduce was launched.*reset the ready "
                                             r"counts in finish\(\)"):
        check_bucketed(NoReset)


def test_the_sum_and_the_own_gradient_have_their_hints():
    class Sum(MyBucketSync):
        def finish(self):                        # the solution's, without the division
            for k, flat, work in self.launched:
                work.wait()
                offset = 0
                for j in self.buckets[k]:
                    g = self.params[j].grad
                    g.copy_(flat[offset:offset + g.numel()].view_as(g))
                    offset += g.numel()
            self.launched, self.missing = [], [len(b) for b in self.buckets]

    with pytest.raises(AssertionError, match=r"gradients after finish\(\) at step 0, 3 processes on rank 0, "
                                             r"element \d+: expected .*every gradient is the sum, not the mean"):
        check_bucketed(Sum)

    class NoCopyBack(MyBucketSync):
        def finish(self):
            for _, _, work in self.launched:
                work.wait()
            self.launched, self.missing = [], [len(b) for b in self.buckets]

    with pytest.raises(AssertionError, match=r"on rank 0, element \d+: .*rank 0 kept its own gradient: copy the "
                                             r"averaged bucket back into each .grad"):
        check_bucketed(NoCopyBack)


def test_refuses_the_library_wrappers():
    class WithDDP:
        def __init__(self, params, buckets):
            from torch.nn.parallel import DistributedDataParallel
            self.ddp = DistributedDataParallel

        def finish(self):
            pass

    with pytest.raises(AssertionError, match=r"WithDDP uses DistributedDataParallel: this exercise writes what it "
                                             r"does"):
        check_bucketed(WithDDP)

    class Hidden:                                # the name hidden from the code: refused on the ranks
        def __init__(self, params, buckets):
            import ddnb.data_parallel.bucketed as b
            getattr(b, "Bucketed" + "DataParallel")(torch.nn.Linear(1, 1))

        def finish(self):
            pass

    with pytest.raises(AssertionError, match=r"Hidden raised on rank \d: AssertionError: check_bucketed: the "
                                             r"library's data-parallel wrappers"):
        check_bucketed(Hidden, world_sizes=(3,))


def test_a_stub_is_not_attempted():
    class MyStub:
        def __init__(self, params, buckets):
            raise NotImplementedError("Exercise 06.5: write MyStub")

        def finish(self):
            raise NotImplementedError("Exercise 06.5: write MyStub")

    said = check_bucketed(MyStub, exercise="06.5")
    assert said.startswith("Exercise 06.5 not attempted yet: ") and "MyStub" in said


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r"cls=None: need a class cls\(params, buckets\).*world_sizes=\(1,\): "
                                         r"need a list of integers 2..8.*steps=0"):
        check_bucketed(None, world_sizes=(1,), steps=0)
