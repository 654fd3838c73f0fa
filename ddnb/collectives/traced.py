"""torch.distributed's own collectives, each one traced on one clock: the event's start and
end come from `ddnb.trace.now()` (time.time() in real mode, the rank's emulated time in an
emulated cluster), so the events of data parallelism, tensor and sequence parallelism and
compression sit on one time axis with the from-scratch algorithms' messages.

    all_reduce(t, group, tracer, name, op=SUM, **fields)     in place; returns t
    all_gather(t, group, tracer, name, out=None, **fields)   (N, *t.shape), rank order
    reduce_scatter(chunks, group, tracer, name, **fields)    this rank's chunk of the sum
    barrier(group, tracer, name)
    broadcast(t, src, group, tracer, name)                   rank src's t on every rank, in place
    all_to_all(out, t, group, tracer, name)                  all_to_all_single, equal splits
    all_reduce_async(t, group)                               a work to .wait() (untraced: the
                                                             caller stamps launch and end)
    ddp_comm_hook()                                          the hook DDP's buckets need, or None

An event is kind "collective", nbytes = the bytes this rank contributes (its tensor; a
reduce-scatter's output), op = the collective, plus `fields`. In an emulated cluster the
emulator plugs in its own versions (`set_emulated`, by `ddnb.emulate.session`): the real
collective, its values torch's, timed by the messages of ddnb's algorithm for it (ring,
binomial tree, pairwise exchange, dissemination barrier), sent for real over the emulated
links on a copy (`ddnb.emulate.messages`). This module never asks whether it is emulated. Taught in
`notebooks/10_tensor_parallelism.ipynb` and `notebooks/14_precision_compression.ipynb`.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ddnb.compat import all_gather_single
from ddnb.trace import Tracer, get_tracer, now

_EMULATED: dict = {}   # op -> the emulator's version (all_reduce, all_gather, barrier), when emulating


def set_emulated(versions: dict | None) -> None:
    """Run `versions` ({"all_reduce": f(t, op, group), "all_gather": f(out, t, group),
    "reduce_scatter": f(out, chunks, group), "broadcast": f(t, src, group), "all_to_all":
    f(out, t, group), "barrier": f(group), "all_reduce_async": f(t, group), "ddp_comm_hook":
    a hook}) instead of torch.distributed's (None: torch's again)."""
    _EMULATED.clear()
    _EMULATED.update(versions or {})


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def all_reduce(tensor: torch.Tensor, group=None, tracer: Tracer | None = None, name: str = "all_reduce",
               op=dist.ReduceOp.SUM, as_op: str = "all_reduce", **fields) -> torch.Tensor:
    """`tensor` reduced (sum, or `op`) over `group`, in place; traced as op `as_op`."""
    start = now()
    if "all_reduce" in _EMULATED:
        _EMULATED["all_reduce"](tensor, op, group)
    else:
        dist.all_reduce(tensor, op=op, group=group)
    get_tracer(tracer).record("collective", name, start, now(), nbytes=_nbytes(tensor), op=as_op, **fields)
    return tensor


def all_gather(tensor: torch.Tensor, group=None, tracer: Tracer | None = None, name: str = "all_gather",
               as_op: str = "all_gather", out: torch.Tensor | None = None, **fields) -> torch.Tensor:
    """Every rank's `tensor`, stacked in rank order: (N, *tensor.shape); traced (nbytes: this
    rank's tensor). `out`: a flat (N·S,) buffer to gather into (ZeRO's flat parameters)."""
    n = dist.get_world_size(group)
    src = tensor.contiguous()
    if out is None:
        out = torch.empty(n * src.numel(), dtype=src.dtype, device=src.device)   # (N·S,)
    start = now()
    (_EMULATED.get("all_gather") or (lambda o, t, g: all_gather_single(o, t, group=g)))(out, src.reshape(-1), group)
    get_tracer(tracer).record("collective", name, start, now(), nbytes=_nbytes(tensor), op=as_op, **fields)
    return out.view(n, *tensor.shape)


def reduce_scatter(chunks: list[torch.Tensor], group=None, tracer: Tracer | None = None,
                   name: str = "reduce_scatter", as_op: str = "reduce_scatter", **fields) -> torch.Tensor:
    """Chunk r (rank r's) of the element-wise sum of every rank's `chunks` (N tensors of
    one shape); traced (nbytes: the chunk this rank gets)."""
    out = torch.empty_like(chunks[0])
    start = now()
    (_EMULATED.get("reduce_scatter") or (lambda o, cs, g: dist.reduce_scatter(o, cs, group=g)))(
        out, [c.contiguous() for c in chunks], group)
    get_tracer(tracer).record("collective", name, start, now(), nbytes=_nbytes(out), op=as_op, **fields)
    return out


def all_reduce_async(tensor: torch.Tensor, group=None):
    """dist.all_reduce(tensor, async_op=True) (sum, in place): something with wait() and
    is_completed(); the caller traces it (`ddnb.data_parallel.bucketed` stamps each
    bucket's launch and end)."""
    if "all_reduce_async" in _EMULATED:
        return _EMULATED["all_reduce_async"](tensor, group)
    return dist.all_reduce(tensor, group=group, async_op=True)


def ddp_comm_hook():
    """The communication hook torch's DDP needs here (`ddp.register_comm_hook(group, hook)`),
    or None for DDP's own all-reduce (real mode)."""
    return _EMULATED.get("ddp_comm_hook")


def broadcast(tensor: torch.Tensor, src: int = 0, group=None, tracer: Tracer | None = None,
              name: str = "broadcast", **fields) -> torch.Tensor:
    """Group rank `src`'s `tensor` copied into `tensor` on every rank of `group`; traced
    (nbytes: the tensor). Returns `tensor`."""
    start = now()
    if "broadcast" in _EMULATED:
        _EMULATED["broadcast"](tensor, src, group)
    else:
        dist.broadcast(tensor, dist.get_global_rank(group, src) if group is not None else src, group=group)
    get_tracer(tracer).record("collective", name, start, now(), nbytes=_nbytes(tensor), op="broadcast", **fields)
    return tensor


def all_to_all(out: torch.Tensor, tensor: torch.Tensor, group=None, tracer: Tracer | None = None,
               name: str = "all_to_all", **fields) -> torch.Tensor:
    """dist.all_to_all_single(out, tensor) with equal splits: chunk j of `tensor` (dim 0)
    to rank j, chunk i of `out` from rank i; traced (nbytes: this rank's input). Returns `out`."""
    start = now()
    if "all_to_all" in _EMULATED:
        _EMULATED["all_to_all"](out, tensor, group)
    else:
        dist.all_to_all_single(out, tensor, group=group)
    get_tracer(tracer).record("collective", name, start, now(), nbytes=_nbytes(tensor), op="all_to_all", **fields)
    return out


def barrier(group=None, tracer: Tracer | None = None, name: str = "barrier") -> None:
    """Every rank of `group` waits for the others; traced (0 bytes)."""
    start = now()
    (_EMULATED.get("barrier") or (lambda g: dist.barrier(group=g)))(group)
    get_tracer(tracer).record("collective", name, start, now(), nbytes=0, op="barrier")
