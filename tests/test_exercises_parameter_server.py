"""check_ps_step (chapter 04) runs the learner's BSP step on real processes against
ddnb.parameter_server.train on the same processes: accepts the solution, rejects a server
that sums, workers that never pull, and an update that is not in place, with their hints."""
import pytest

from ddnb.exercises.parameter_server import check_ps_step
from ddnb.exercises.solutions.parameter_server import ps_step


def _step(params, compute_grad, lr, reduce="mean", pull=True, in_place=True):
    import torch
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        if pull:
            for w in range(1, n):
                dist.send(params, w)
        grads = [torch.empty_like(params) for _ in range(1, n)]
        for w, g in zip(range(1, n), grads):
            dist.recv(g, w)
        update = lr * getattr(torch.stack(grads), reduce)(0)
        if in_place:
            params -= update
        else:
            params = params - update       # a new tensor: the caller's params never change
    else:
        if pull:
            dist.recv(params, 0)
        dist.send(compute_grad(params), 0)


def test_accepts_the_solution():
    assert check_ps_step(ps_step, world_size=3).startswith("✓ check_ps_step: the server's parameters equal "
                                                           "ddnb.parameter_server's (BSP) after 3 steps with 2 workers")
    assert check_ps_step(ps_step, world_size=4, steps=2)


@pytest.mark.parametrize("kwargs, hint", [
    (dict(reduce="sum"), r"the server applied the sum of the workers' gradients"),
    (dict(pull=False), r"the workers computed every gradient at the initial parameters: pull"),
    (dict(in_place=False), r"the server's parameters never changed: apply the update to `params` in place"),
])
def test_rejects_wrong_steps_with_a_hint(kwargs, hint):
    def wrong(params, compute_grad, lr):
        _step(params, compute_grad, lr, **kwargs)

    with pytest.raises(AssertionError, match=r"the server's \(rank 0\) parameters after 3 steps, element \d+: ddnb's "
                                             r"parameter server has .*, yours .*\. " + hint):
        check_ps_step(wrong, world_size=3)


def test_refuses_bad_arguments():
    with pytest.raises(ValueError, match=r"fn=None: need a function.*world_size=1.*lr=0"):
        check_ps_step(None, world_size=1, lr=0)
