"""The backward of one pipeline stage split in two (Qi et al. 2024, "Zero Bubble Pipeline
Parallelism", ICLR 2024, arXiv 2401.10241, Sec. 2, Fig. 1): B, the gradient of the
stage's input, which the previous stage waits for, and W, the gradients of its weights,
which nothing waits for and a zero-bubble schedule runs later, in a bubble.

    dx, saved = backward_input(out, grad, x, stage.parameters())   # B: send dx upstream
    ...                                                              # other work, in the bubble
    backward_weight(saved, stage.parameters())                      # W: accumulate into .grad

For a linear layer y = x Wᵀ both halves start from dy, the gradient at the layer's
output: B computes dx = dy W, W computes dW = dyᵀ x (and db = Σ dy). Naive first:
`backward_input_naive` asks autograd for dx only and keeps the graph; `backward_weight_naive`
back-propagates from the stage's output again, asking for the weights only. Autograd
then skips the input-only products of the first layer but must rebuild dy for every
other layer from the output down: W costs nearly a full backward, B + W nearly two.

`backward_input` / `backward_weight` are torch's `stage_backward_input` /
`stage_backward_weight` (`torch.distributed.pipelining._backward`, torch 2.13; a private
module, what torch's own ScheduleZBVZeroBubble and ScheduleDualPipeV run): during B a
hook on each autograd node where a weight's path joins the input's path (for y = x Wᵀ + b,
the addmm) keeps the gradient arriving there, dy; W starts autograd from those nodes with
those gradients and asks for the weights only, so it runs the weight products alone
(same FLOPs in B + W as in one full backward; `tests/test_zero_bubble_run.py` counts
them). Memory: a micro-batch stays held from F until its W. The paper's implementation
keeps for W only the inputs of the weight products and the gradients at their outputs,
M_W < M_B (Sec. 2.3); here the autograd nodes W starts from keep alive every node below
them, down to the stage's input, and with them all the tensors those saved: B frees only
the part of the graph above the last weight (the loss's, on the last stage). Measured on
the GPT's blocks, a micro-batch waiting for its W still holds all of its activations:
M_W = M_B, so ZB-H1 holds p·M_B on every rank (1F1B's peak, on rank 0 only).

The first stage has no input gradient to send (its input, token ids, needs none): there B
does nothing and W runs the whole backward, as torch's stage does (`backward_one_chunk`
with full_backward=False on stage 0). `backward_flops` counts the FLOPs of the three ways
on one module. Taught in `notebooks/09b_zero_bubble.ipynb`.
"""
from __future__ import annotations

import torch


def _needs_grad(x) -> bool:
    return isinstance(x, torch.Tensor) and x.requires_grad


def backward_input_naive(out: torch.Tensor, grad: torch.Tensor | None, x: torch.Tensor | None):
    """B the naive way: d loss / d x from `out` (the loss when `grad` is None, else the
    stage's output with `grad` its gradient), the whole graph kept for W. Returns (dx or
    None on the first stage, what `backward_weight_naive` needs)."""
    dx = torch.autograd.grad(out, x, grad, retain_graph=True)[0] if _needs_grad(x) else None
    return dx, (out, grad)


def backward_weight_naive(saved, params) -> None:
    """W the naive way: back-propagate from the output again, asking for the weights only
    (`torch.autograd.backward(..., inputs=params)`): nearly a second full backward."""
    out, grad = saved
    torch.autograd.backward(out, grad, inputs=[q for q in params if q.requires_grad])


def backward_input(out: torch.Tensor, grad: torch.Tensor | None, x: torch.Tensor | None, params):
    """B: d loss / d x only (`out` is the loss when `grad` is None, else the stage's output
    with `grad` its gradient), the gradients W will need kept at the nodes where the
    weights join. Returns (dx, or None on the first stage, and what `backward_weight`
    needs). `out` is detached in place afterwards (torch frees the output side of the
    graph so); an output that is a view is cloned first, as in-place detach refuses views."""
    if not _needs_grad(x):                         # first stage: nothing to send, all of it in W
        return None, ("full", out, grad)
    from torch.distributed.pipelining._backward import stage_backward_input

    root = out.clone() if out._is_view() else out
    dx, groups = stage_backward_input([root], None if grad is None else [grad], [x], iter(list(params)))
    return dx[0], ("split", groups, None)


def backward_weight(saved, params) -> None:
    """W: accumulate the weights' gradients into .grad from what `backward_input` kept,
    running only the weight products; frees what B left for it."""
    kind, a, b = saved
    if kind == "full":
        torch.autograd.backward(a, b)
        return
    from torch.distributed.pipelining._backward import stage_backward_weight

    stage_backward_weight(iter(list(params)), a)


def backward_flops(module, x: torch.Tensor) -> dict[str, int]:
    """FLOPs (torch.utils.flop_counter) of one forward ("F") and one backward of `module`
    at input `x`, its output's gradient all ones: "full" (one autograd pass), "B" and "W"
    as `backward_input` / `backward_weight` split it, "naive B" and "naive W" as the naive
    pair does. For a Linear stack F = B = W (each a product of the same size, the T_F =
    T_B = T_W of Qi et al. 2024, Sec. 2.1), B + W = full, and the naive W nearly a full."""
    from torch.utils.flop_counter import FlopCounterMode

    def counted(fn, *args):
        with FlopCounterMode(display=False) as count:
            out = fn(*args)
        return count.get_total_flops(), out

    out = {}
    for how, (b_pass, w_pass) in {"": (backward_input, backward_weight),
                                  "naive ": (lambda y, g, xi, ps: backward_input_naive(y, g, xi),
                                             backward_weight_naive)}.items():
        xi = x.detach().clone().requires_grad_()
        y = module(xi)
        out[how + "B"], (_, saved) = counted(b_pass, y, torch.ones_like(y), xi, module.parameters())
        out[how + "W"], _ = counted(w_pass, saved, module.parameters())
    xi = x.detach().clone().requires_grad_()
    out["F"], y = counted(module, xi)
    out["full"], _ = counted(torch.autograd.backward, y, torch.ones_like(y))
    module.zero_grad(set_to_none=True)
    return out
