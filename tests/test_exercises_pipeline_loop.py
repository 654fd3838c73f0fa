"""check_pipeline_loop (chapter 09): the learner's executor loop over one rank's actions
accepts the solution (GPipe and 1F1B, 4 and 3 stages) and rejects the usual mistakes with
their hints, naming the rank: a loss not divided by m, a received activation that does
not require grad, every F run before any B (the peak of saved activations exceeds 1F1B's
p - r), blocking sends and a missing gradient send (a deadlock, named at the deadline),
and ddnb's own executor."""
import pytest

from ddnb.exercises import check_pipeline_loop as wrapped_check
from ddnb.exercises.pipeline_loop import check_pipeline_loop
from ddnb.exercises.solutions.pipeline_loop import run_actions


def variant(divide=True, in_order=True, requires_grad=True, send_grad=True, blocking=False):
    """The solution's loop with one mistake switched on."""
    def loop(stage, actions, inputs, targets, loss_fn):
        import torch
        import torch.distributed as dist

        m, kept, sends = len(inputs), {}, []
        send = (lambda t, dst: dist.send(t, dst)) if blocking else (lambda t, dst: sends.append(dist.isend(t, dst)))
        if not in_order:                                  # GPipe whatever the schedule says
            actions = [a for a in actions if a.op == "F"] + [a for a in actions if a.op == "B"]
        for a in actions:
            j = a.microbatch
            if a.op == "F":
                if stage.prev is None:
                    x = inputs[j]
                else:
                    x = torch.empty(stage.shape)
                    dist.recv(x, stage.prev)
                    if requires_grad:
                        x.requires_grad_()
                y = stage.module(x)
                if stage.next is None:
                    y = loss_fn(y, targets[j]) / (m if divide else 1)
                else:
                    send(y.detach(), stage.next)
                kept[j] = (x, y)                          # kept forever: fine, backward frees the graph
            else:
                x, y = kept[j]
                if stage.next is None:
                    y.backward()
                else:
                    grad = torch.empty(stage.shape)
                    dist.recv(grad, stage.next)
                    y.backward(grad)
                if stage.prev is not None and send_grad:
                    send(x.grad, stage.prev)
        for s in sends:
            s.wait()
    return loop


def calls_run_schedule(stage, actions, inputs, targets, loss_fn):
    from ddnb.pipeline_parallel import run_schedule

    run_schedule(stage, actions, inputs, targets, loss_fn)


def test_accepts_the_solution_and_keeping_every_activation():
    assert check_pipeline_loop(run_actions).startswith("✓ check_pipeline_loop")
    assert check_pipeline_loop(variant(), cases=((4, "1f1b", 4),))


def test_stub_is_not_attempted():
    def my_run_actions(stage, actions, inputs, targets, loss_fn):
        raise NotImplementedError("Exercise 09.2: write my_run_actions")

    assert "not attempted yet" in wrapped_check(my_run_actions, exercise="09.2")


def test_refuses_run_schedule():
    with pytest.raises(AssertionError, match=r"calls_run_schedule calls run_schedule, ddnb's executor"):
        check_pipeline_loop(calls_run_schedule)


def test_loss_not_divided_by_m():
    with pytest.raises(AssertionError, match=r"GPipe, 4 stages, m = 4: rank \d's gradients differ .* 4\.00 x one "
                                             r"process's.*loss_fn\(y, t\) / m"):
        check_pipeline_loop(variant(divide=False))


def test_received_activation_without_grad():
    with pytest.raises(AssertionError, match=r"raised on rank [123].*x\.requires_grad_\(\)"):
        check_pipeline_loop(variant(requires_grad=False), cases=((4, "gpipe", 4),))


def test_all_forwards_first_passes_gpipe_not_1f1b():
    all_f_first = variant(in_order=False)
    assert check_pipeline_loop(all_f_first, cases=((4, "gpipe", 4), (3, "gpipe", 6)))
    with pytest.raises(AssertionError, match=r"1F1B, 4 stages, m = 6: rank 0 held the activations of 6\.0 "
                                             r"micro-batches at once .* at most 4\. Run the actions in the order"):
        check_pipeline_loop(all_f_first)


def test_deadlocks_are_named_at_the_deadline():
    blocking = variant(blocking=True)
    assert check_pipeline_loop(blocking, cases=((4, "gpipe", 4),))          # GPipe never sends both ways at once
    with pytest.raises(AssertionError, match=r"\(1F1B, 4 stages, m = 6\) did not finish within 3 s on rank\(s\) "
                                             r"\[[0-3, ]+\].*dist\.isend"):
        check_pipeline_loop(blocking, cases=((4, "1f1b", 6),), timeout=3)
    with pytest.raises(AssertionError, match=r"\(GPipe, 3 stages, m = 4\) did not finish within 3 s on rank\(s\) "
                                             r"\[[0-2, ]+\].*sends its input's gradient to prev"):
        check_pipeline_loop(variant(send_grad=False), cases=((3, "gpipe", 4),), timeout=3)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r"cases\[0\]=\(5, 'gpipe', 4\)"):
        check_pipeline_loop(run_actions, cases=((5, "gpipe", 4),))
    with pytest.raises(ValueError, match=r"fn=3: need a function"):
        check_pipeline_loop(3)
