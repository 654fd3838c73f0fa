"""Model replication: every rank holds a full copy of the model, and the copies must start
identical, or the ranks train N different models whose averaged gradients mean nothing.

    replicate(model)          check the ranks hold the same architecture, then broadcast
                              every parameter and buffer from rank 0, then verify
    broadcast_module(model)   the broadcast alone (torch.distributed.broadcast per tensor)
    check_replicas(model)     the verification alone: checksum every tensor on every rank,
                              gather the checksums, and raise ReplicaMismatchError on
                              *every* rank, naming the tensors and ranks that differ

The check gathers, from each rank, the list (name, shape, dtype) of the module's
parameters and buffers, a CRC-32 of each tensor's bytes, and the caller's `config` (e.g.
the bucket size: every rank must bucket the same way), with one
`torch.distributed.all_gather_object`: a collective whose size does not depend on the
model, so ranks whose models differ get an error, never a hang in a later broadcast.
Bit-exact equality is the right test: a broadcast copies bytes, and data-parallel
training keeps replicas bit-identical only if they start so (Li et al., "PyTorch
Distributed", VLDB 2020, Sec. 3.2.1: DDP broadcasts the state from rank 0 at
construction for the same reason). Taught in `notebooks/06_data_parallelism.ipynb`.
"""
from __future__ import annotations

import zlib

import torch
import torch.distributed as dist
from torch import nn

from ddnb.collectives import traced
from ddnb.trace import Tracer

_QUIET = Tracer(enabled=False)   # set-up, not a step: its broadcasts are timed, not traced


class ReplicaMismatchError(ValueError):
    """The ranks' model replicas (or their data-parallel configuration) differ."""


def module_tensors(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) of every parameter, then every buffer, in registration order."""
    return list(module.named_parameters()) + [(f"buffer:{n}", b) for n, b in module.named_buffers()]


def checksum(tensor: torch.Tensor) -> int:
    """CRC-32 of the tensor's bytes (contiguous, on the host): equal iff bit-identical
    (up to CRC collisions, 1 in 2^32)."""
    flat = tensor.detach().contiguous().reshape(-1)
    return zlib.crc32(flat.view(torch.uint8).cpu().numpy().tobytes()) if flat.numel() else 0


def broadcast_module(module: nn.Module, src: int = 0, group=None) -> nn.Module:
    """Copy every parameter and buffer of rank `src` (a rank of `group`) into the other
    ranks' module, in place, one torch.distributed.broadcast per tensor (through the one
    traced layer: timed by its messages in an emulated cluster). Every rank must hold the
    same architecture (check it first with `check_replicas(values=False)`)."""
    n = dist.get_world_size(group)
    if not 0 <= src < n:
        raise ValueError(f"broadcast_module: src={src} is not a rank of the group (0..{n - 1})")
    with torch.no_grad():
        for _, t in module_tensors(module):
            if t.is_contiguous():
                traced.broadcast(t.data, src, group, tracer=_QUIET)
            else:
                flat = t.data.contiguous()
                traced.broadcast(flat, src, group, tracer=_QUIET)
                t.data.copy_(flat)
    return module


def _describe(t: torch.Tensor) -> str:
    return f"{tuple(t.shape)} {str(t.dtype).replace('torch.', '')}"


def check_replicas(module: nn.Module, group=None, values: bool = True, config: dict | None = None) -> None:
    """Raise ReplicaMismatchError on every rank if the ranks' modules differ in their
    tensors' names, shapes or dtypes, in `config`, or (values=True) in any tensor's bytes.
    Call it on every rank of the group at once; one all_gather_object, ~N·(#tensors) ints."""
    tensors = module_tensors(module)
    mine = {"structure": [(name, _describe(t)) for name, t in tensors],
            "config": dict(config or {}),
            "checksums": [checksum(t) for _, t in tensors] if values else None}
    n = dist.get_world_size(group)
    every = [None] * n
    dist.all_gather_object(every, mine, group=group)
    rank = dist.get_rank(group)
    problems = _config_problems(every) + _structure_problems(every)
    if not problems and values:
        problems = _value_problems(every)
    if problems:
        shown = problems[:8] + ([f"... and {len(problems) - 8} more"] if len(problems) > 8 else [])
        raise ReplicaMismatchError(
            f"rank {rank}: the {n} model replicas differ:\n  " + "\n  ".join(shown) +
            "\nEvery rank must build the same model (same code, same seed) and the same data-parallel "
            "configuration; broadcast the parameters from rank 0 (ddnb.data_parallel.replicate / "
            "broadcast_module) before training.")


def _ranks_by(values) -> str:
    groups: dict = {}
    for r, v in enumerate(values):
        groups.setdefault(repr(v), []).append(r)
    return "; ".join(f"ranks {ranks}: {v}" for v, ranks in groups.items())


def _config_problems(every) -> list[str]:
    keys = sorted({k for e in every for k in e["config"]})
    return [f"config {k!r}: {_ranks_by([e['config'].get(k) for e in every])}"
            for k in keys if len({repr(e["config"].get(k)) for e in every}) > 1]


def _structure_problems(every) -> list[str]:
    structures = [e["structure"] for e in every]
    if all(s == structures[0] for s in structures):
        return []
    counts = [len(s) for s in structures]
    problems = [] if len(set(counts)) == 1 else [f"number of parameters + buffers: {_ranks_by(counts)}"]
    for i in range(max(counts)):
        entries = [s[i] if i < len(s) else None for s in structures]
        if len({repr(x) for x in entries}) > 1:
            problems.append(f"tensor #{i}: {_ranks_by(entries)}")
    return problems


def _value_problems(every) -> list[str]:
    names = [name for name, _ in every[0]["structure"]]
    return [f"{name!r} values differ: checksum {_ranks_by([hex(e['checksums'][i]) for e in every])}"
            for i, name in enumerate(names) if len({e["checksums"][i] for e in every}) > 1]


def replicate(module: nn.Module, src: int = 0, group=None, config: dict | None = None) -> nn.Module:
    """Make every rank's `module` a bit-identical copy of rank `src`'s: check the
    architecture (and `config`) agree, broadcast, verify. Returns the module. Set-up, not
    training: untimed in an emulated cluster (`ddnb.emulate.uncounted`)."""
    from ddnb.emulate.compute import uncounted

    with uncounted():
        check_replicas(module, group, values=False, config=config)
        broadcast_module(module, src, group)
        check_replicas(module, group, values=True)
    return module
