"""Solution of `ddnb.exercises.pipeline_loop` (`notebooks/09_pipeline_parallelism.ipynb`)."""
from __future__ import annotations


def run_actions(stage, actions, inputs, targets, loss_fn):
    """One rank's actions of a pipeline schedule: F(j) receives (or reads) micro-batch j,
    runs the stage and sends its output on (the last stage keeps loss / m); B(j)
    back-propagates with the gradient received from next and sends its input's gradient
    to prev. Sends are posted (isend) and waited at the end, so no two neighbours block
    each other sending (Megatron-LM's batched p2p, Narayanan et al. 2021, Sec. 4.1)."""
    import torch
    import torch.distributed as dist

    m, kept, sends = len(inputs), {}, []
    for a in actions:
        j = a.microbatch
        if a.op == "F":
            if stage.prev is None:
                x = inputs[j]
            else:
                x = torch.empty(stage.shape)
                dist.recv(x, stage.prev)
                x.requires_grad_()                      # backward fills x.grad, sent to prev
            y = stage.module(x)
            if stage.next is None:
                y = loss_fn(y, targets[j]) / m          # the step's loss is the mean over micro-batches
            else:
                sends.append(dist.isend(y.detach(), stage.next))
            kept[j] = (x, y)
        else:
            x, y = kept.pop(j)
            if stage.next is None:
                y.backward()
            else:
                grad = torch.empty(stage.shape)
                dist.recv(grad, stage.next)
                y.backward(grad)
            if stage.prev is not None:
                sends.append(dist.isend(x.grad, stage.prev))
    for s in sends:
        s.wait()
