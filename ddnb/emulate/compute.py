"""Compute in emulated time: every torch operation a worker runs is charged its modeled time.

A TorchDispatchMode sees each aten operation after autograd has split forward and
backward into operations, so a layer's backward is charged the backward's FLOPs, op by
op, when it runs. An operation's time is the roofline max(FLOPs / (peak x MFU), bytes /
memory bandwidth) (`Profile.compute_time`): FLOPs from torch.utils.flop_counter's
formulas (matmuls, convolutions, attention: 2mnk for an (m, k) @ (k, n) matmul); bytes
are the operation's tensor inputs and outputs (elementwise work, the optimizer's update).
Views (outputs that alias an input without writing it) cost nothing. The real arithmetic
still runs, so results are bit-identical to real mode; only time is modeled.

The mode is per thread (PyTorch keeps dispatch modes thread-locally): the thread that
calls `activate` is paced, which on CPU includes autograd's backward (it runs in the
caller's thread). Communication is timed by the message layer (`ddnb.emulate.messages`),
which issues its torch.distributed calls inside `uncounted()`; a torch.distributed call made
anywhere else (a raw `dist.barrier()` in a user's function, DDP's broadcast of the
parameters at construction) takes no emulated time, and is counted so that the run's
summary says so (`Emulator.unmodeled`). Taught in `notebooks/09_pipeline_parallelism.ipynb`.
"""
from __future__ import annotations

import contextlib
import threading

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry


def _tensor_bytes(tree) -> int:
    total = 0
    stack = [tree]
    while stack:
        x = stack.pop()
        if isinstance(x, torch.Tensor):
            total += x.numel() * x.element_size()
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
        elif isinstance(x, dict):
            stack.extend(x.values())
    return total


def _is_view(func) -> bool:
    """True when every output aliases an input without writing to it (view, reshape, ...)."""
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


def op_cost(func, args, kwargs, out) -> tuple[float, float]:
    """(FLOPs, bytes) of one aten operation; communication (c10d) is charged by the
    message layer, not here."""
    if func.namespace != "aten" or _is_view(func):
        return 0.0, 0.0
    formula = flop_registry.get(func._overloadpacket)
    flops = float(formula(*args, **kwargs, out_val=out)) if formula is not None else 0.0
    return flops, float(_tensor_bytes(args) + _tensor_bytes(kwargs) + _tensor_bytes(out))


_LAYER = threading.local()


@contextlib.contextmanager
def uncounted():
    """torch.distributed calls made inside are not counted as untimed ones: the message
    layer's own (it times them), and set-up or bookkeeping that is not part of what is
    measured (replicating a model before training, gathering results after). Costs nothing
    in real mode."""
    _LAYER.depth = getattr(_LAYER, "depth", 0) + 1
    try:
        yield
    finally:
        _LAYER.depth -= 1


class PacedCompute(TorchDispatchMode):
    """Charges every operation of this thread to `emulator` (`ddnb.emulate.clock.Emulator`)."""

    def __init__(self, emulator):
        super().__init__()
        self.emulator = emulator

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.namespace == "c10d" and not getattr(_LAYER, "depth", 0) and _tensor_bytes(args):   # no bytes: no message
            self.emulator.count_unmodeled(func.__name__.split(".")[0])
        flops, nbytes = op_cost(func, args, kwargs, out)
        if flops or nbytes:
            self.emulator.charge(self.emulator.profile.compute_time(flops, nbytes), flops)
        return out


_MODE: PacedCompute | None = None


def start_pacing(emulator) -> None:
    """Charge this thread's torch operations to `emulator` until stop_pacing()."""
    global _MODE
    stop_pacing()
    _MODE = PacedCompute(emulator)
    _MODE.__enter__()


def stop_pacing() -> None:
    global _MODE
    if _MODE is not None:
        mode, _MODE = _MODE, None
        mode.__exit__(None, None, None)


def paused():
    """A context in which this thread's operations are not charged (the emulator's own
    bookkeeping tensors)."""
    from torch.utils._python_dispatch import _disable_current_modes

    return _disable_current_modes()
