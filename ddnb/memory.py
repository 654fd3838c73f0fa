"""Measured per-rank memory: parameters, gradients, optimizer state and activations.

Training memory has four parts (Rajbhandari et al. 2020, "ZeRO", Sec. 3): the parameters Ψ,
their gradients Ψ, the optimizer state (Adam: two more tensors per parameter, K·Ψ in the
paper's notation), and the *activations* autograd saves during forward to use in backward,
which grow with batch size and sequence length and are freed as backward consumes them.
Model parallelism (notebook 08), pipelines (09) and tensor parallelism (10) each divide a
different part among the ranks, and ZeRO (11) the first three; this module measures them,
on CPU as well as on GPU, so the notebooks show measured bytes rather than formulas.

    mem = model_memory(model, optimizer)          # {"parameters": .., "gradients": .., "optimizer": ..}
    with SavedActivations() as act:
        loss = loss_fn(model(x), y)               # act.live: bytes autograd holds for backward
        loss.backward()                           # ... released again: act.live == 0
    mem["activations"] = act.peak
    cuda_peak_bytes()                             # torch.cuda.max_memory_allocated, or None on CPU

`SavedActivations` counts with `torch.autograd.graph.saved_tensors_hooks`: every tensor
autograd packs for backward passes through its pack hook (counted once per storage), and
the packed handle is freed with the graph, which un-counts it. That is the real number of
bytes forward keeps alive, not an estimate. Taught in `notebooks/08_model_parallelism.ipynb`.
"""
from __future__ import annotations

import threading
from typing import Iterable

import torch
from torch import nn

PARTS = ("parameters", "gradients", "optimizer", "activations")


def _storage(t: torch.Tensor):
    """(key, bytes) of the storage under `t`: views of one storage share the key."""
    s = t.untyped_storage()
    return (t.device.type, t.device.index, s.data_ptr()), s.nbytes()


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the storages under `tensors`, each storage counted once (two views of one
    buffer, or a parameter listed twice, are one allocation). Empty tensors count 0."""
    seen, total = set(), 0
    for t in tensors:
        if t is None or t.numel() == 0:
            continue
        key, size = _storage(t)
        if key not in seen:
            seen.add(key)
            total += size
    return total


def _state_tensors(optimizer: torch.optim.Optimizer):
    for state in optimizer.state.values():
        for v in state.values():
            if torch.is_tensor(v):
                yield v


def model_memory(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict:
    """Bytes of this rank's parameters, their gradients (None counts 0) and the tensors in
    `optimizer.state` (SGD momentum: one buffer per parameter; Adam: exp_avg, exp_avg_sq and
    a scalar step per parameter, after the first step). Returns {"parameters", "gradients",
    "optimizer"} in bytes."""
    params = list(model.parameters())
    return {"parameters": tensor_bytes(params),
            "gradients": tensor_bytes(p.grad for p in params if p.grad is not None),
            "optimizer": 0 if optimizer is None else tensor_bytes(_state_tensors(optimizer))}


def _is_parameter(t: torch.Tensor) -> bool:
    """An nn.Parameter, or a view of one (Linear saves weight.t(), a view of its weight)."""
    return isinstance(t._base if t._base is not None else t, nn.Parameter)


class _Packed:
    """What autograd stores in place of a saved tensor while the hooks are on; freeing it
    (when backward releases the graph, or the graph is dropped) un-counts its storage."""

    __slots__ = ("tensor", "owner", "key")

    def __init__(self, tensor, owner, key):
        self.tensor, self.owner, self.key = tensor, owner, key

    def __del__(self):
        if self.key is not None:
            self.owner._release(self.key)


class SavedActivations:
    """Live bytes of the tensors autograd saves for backward while this context is active.

    Parameters (nn.Parameter and views of them) are not activations and are not counted,
    nor are the storages of the tensors in `ignore` (weights kept as plain tensors). Leaf
    tensors that require grad *are* counted: a pipeline or model-parallel stage's received
    input is one, and it is an activation. A storage saved by several operations counts
    once. `live` is the bytes held now, `peak` the most held at once since the start or the
    last `reset_peak()`. Tensors saved inside the context are un-counted when released,
    even after the context exits; the context can be entered again (e.g. once per step)."""

    def __init__(self, ignore: Iterable[torch.Tensor] = ()):
        self.live = 0
        self.peak = 0
        self._ignore = {_storage(t)[0] for t in ignore if t is not None and t.numel() > 0}
        self._refs: dict = {}   # storage key -> [number of packed handles, bytes]
        self._lock = threading.Lock()
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, t: torch.Tensor):
        # keep a detached alias (same storage and version counter, no grad_fn): an op that
        # saves its own output (ReLU, softmax) would otherwise form the cycle output ->
        # grad_fn -> packed -> output, which Python's gc cannot see, and never be freed.
        # The price: no double backward (create_graph=True) through this context.
        parameter = _is_parameter(t)
        if not t.is_leaf:
            t = t.detach()
        if parameter or t.numel() == 0:
            return _Packed(t, self, None)
        key, size = _storage(t)
        if key in self._ignore:
            return _Packed(t, self, None)
        with self._lock:
            ref = self._refs.setdefault(key, [0, size])
            ref[0] += 1
            if ref[0] == 1:
                self.live += size
                self.peak = max(self.peak, self.live)
        return _Packed(t, self, key)

    @staticmethod
    def _unpack(packed: _Packed) -> torch.Tensor:
        return packed.tensor

    def _release(self, key) -> None:
        with self._lock:
            ref = self._refs[key]
            ref[0] -= 1
            if ref[0] == 0:
                self.live -= ref[1]
                del self._refs[key]

    def reset_peak(self) -> None:
        """Start a new peak from what is live now."""
        self.peak = self.live

    def __enter__(self) -> "SavedActivations":
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)

    def __repr__(self) -> str:
        return f"SavedActivations(live={self.live}, peak={self.peak})"


def cuda_peak_bytes(device=None) -> int | None:
    """`torch.cuda.max_memory_allocated(device)` (everything the caching allocator handed
    out, at its peak) where `device` is CUDA (None: the current CUDA device, if any), else
    None: on CPU, `SavedActivations` and `model_memory` are the measurement."""
    if device is not None and torch.device(device).type != "cuda":
        return None
    if not torch.cuda.is_available():
        return None
    return int(torch.cuda.max_memory_allocated(device))
