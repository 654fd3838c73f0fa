"""Checkpoints with `torch.distributed.checkpoint` (DCP): saved by N ranks, loaded by M.

`ddnb.data_parallel.checkpoint` writes one file per rank and refuses another world size.
DCP instead writes, for every tensor, which part of the *global* tensor each rank holds
(its chunk: offsets and lengths), and on load each rank asks for the part it holds now;
the reader cuts it out of the saved chunks. So the checkpoint is resharded on load:

    replicated tensor   (a plain torch.Tensor, the same on every rank): saved once
                        (duplicates are removed from the save plan), loaded whole by every rank
    sharded tensor      (a DTensor, Shard(0) over a device mesh): rank r of N saves its
                        chunk [r·S_N, min((r+1)·S_N, numel)), S_N = ceil(numel / N); rank q
                        of M loads [q·S_M, ...), read from whichever saved chunks cover it
    anything else       (ints, strings): pickled, saved once

Three kinds of training state, each a DCP `Stateful` (state_dict / load_state_dict):

    ModelState(model, optimizer)   a replicated model (DDP-style) or a torch FSDP2 model
                                   (`fully_shard`): through torch's `get_state_dict` /
                                   `set_state_dict`, which give FSDP2's parameters and Adam
                                   moments as DTensors
    ZeroState(zero)                ddnb's own ZeRO (`ddnb.sharding.ZeroStage3`, also 1 and 2):
                                   its flat (S,) shards, padding cut off, as DTensors over the
                                   unit's numel, and Adam's exp_avg / exp_avg_sq likewise
    ElasticSampler                 `ddnb.elastic.sampler`: the position (epoch, consumed)

The files hold global tensors, not a layout: FSDP2 state saved on 4 ranks loads into a
replicated model on 2 (the same names: `fully_shard` keeps the module's FQNs).

    save({"model": ModelState(model, opt), "sampler": sampler}, "ckpt/")   # on N ranks
    load({"model": ModelState(model2, opt2), "sampler": sampler2}, "ckpt/") # on M ranks

The format is DCP's (PyTorch's "Distributed Checkpoint" documentation; torchtitan's
checkpoints use it too). Taught in
`notebooks/15_elastic_training.ipynb`.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from ddnb._checks import Checks


def _check_directory(directory, where: str) -> str:
    with Checks(where) as check:
        check.rule(isinstance(directory, (str, os.PathLike)) and str(directory) != "",
                   f"directory={directory!r} must be a path (a folder every rank can read)")
    return os.fspath(directory)


def save(state: dict, directory) -> None:
    """dcp.save of `state` (names -> tensors, DTensors or Statefuls) into `directory`
    with a FileSystemWriter; a collective: call it on every rank."""
    import torch.distributed.checkpoint as dcp

    directory = _check_directory(directory, "save")
    dcp.save(state, storage_writer=dcp.FileSystemWriter(directory))


def load(state: dict, directory) -> None:
    """dcp.load into `state` in place (every tensor and DTensor of it is filled, each
    Stateful gets `load_state_dict`); any world size; a collective: call it on every rank."""
    import torch.distributed.checkpoint as dcp

    directory = _check_directory(directory, "load")
    with Checks("load") as check:
        check.rule(os.path.isfile(os.path.join(directory, ".metadata")),
                   f"{directory} holds no DCP checkpoint (no .metadata file)")
    dcp.load(state, storage_reader=dcp.FileSystemReader(directory))


class ModelState:
    """A model and its optimizer as DCP state: torch's `get_state_dict` (plain tensors for
    a replicated model, DTensors for an FSDP2 one) and `set_state_dict` on load."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None):
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

        if self.optimizer is None:
            return {"model": get_model_state_dict(self.model)}
        model, optim = get_state_dict(self.model, self.optimizer)   # (an empty Adam gets its state made)
        return {"model": model, "optim": optim}

    def load_state_dict(self, state: dict) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

        if self.optimizer is None:
            set_model_state_dict(self.model, state["model"])
        else:
            set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                           optim_state_dict=state["optim"])


def valid_numel(numel: int, shard: int, rank: int) -> int:
    """Elements of rank's (S,) shard that are not padding: min(S, numel - rank·S), at least 0.
    The same chunk as a DTensor's Shard(0) over the world (ceil-sized chunks, the last short)."""
    return max(0, min(shard, numel - rank * shard))


def _mesh(group, device_type: str):
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    if group is None:
        return init_device_mesh(device_type, (dist.get_world_size(),))
    return DeviceMesh.from_group(group, device_type)


class ZeroState:
    """ddnb's ZeRO as DCP state: unit u's shard (S,) on rank r becomes the DTensor chunk
    [r·S, r·S + valid) of a (numel_u,) tensor; Adam's moments the same; `step` replicated.
    The DTensors are views of the shards, so dcp.load writes straight into them; then
    stages 1 and 2 all-gather the full parameters again (stage 3 gathers on demand)."""

    def __init__(self, zero):
        self.zero = zero

    def _dtensor(self, local: torch.Tensor, unit, mesh):
        from torch.distributed.tensor import DTensor, Shard

        n = valid_numel(unit.numel, unit.shard_numel, unit.rank)
        return DTensor.from_local(local[:n], mesh, [Shard(0)], run_check=False,   # (n,) of (numel_u,)
                                  shape=torch.Size([unit.numel]), stride=(1,))

    def _adam_state(self, shard: torch.nn.Parameter) -> dict:
        state = self.zero.optimizer.state[shard]
        if not state:       # a fresh wrapper (before its first step): the tensors to load into
            state.update(step=torch.tensor(0.0), exp_avg=torch.zeros_like(shard.detach()),
                         exp_avg_sq=torch.zeros_like(shard.detach()))
        return state

    def state_dict(self) -> dict:
        units, shards = self.zero.units, self.zero.shards
        mesh = _mesh(self.zero.group, shards[0].device.type)
        out = {}
        for i, (u, shard) in enumerate(zip(units, shards)):
            adam = self._adam_state(shard)
            out[f"unit{i}"] = {"param": self._dtensor(shard.data, u, mesh),
                               "exp_avg": self._dtensor(adam["exp_avg"], u, mesh),
                               "exp_avg_sq": self._dtensor(adam["exp_avg_sq"], u, mesh),
                               "step": adam["step"]}                     # scalar, the same on every rank
        return out

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        for i, shard in enumerate(self.zero.shards):
            adam, saved = self._adam_state(shard), state[f"unit{i}"]
            for key in ("param", "exp_avg", "exp_avg_sq"):
                target = shard.data if key == "param" else adam[key]
                got = saved[key].to_local() if hasattr(saved[key], "to_local") else saved[key]
                n = got.numel()
                if got.data_ptr() != target.data_ptr():   # DCP loaded in place, normally
                    target[:n].copy_(got)
                target[n:].zero_()                        # padding: zero, as a fresh wrapper has it
            adam["step"].copy_(saved["step"])
        self.zero._gather_parameters()     # stages 1 and 2 keep full parameters: refresh them


def full_adam_state(zero) -> dict:
    """Adam's exp_avg and exp_avg_sq of a ZeRO wrapper over all ranks, flat (Ψ,) in the
    units' order, padding removed (a collective), and the steps: for checking a reload."""
    from ddnb.compat import all_gather_single

    out = {"exp_avg": [], "exp_avg_sq": [], "step": []}
    for u, shard in zip(zero.units, zero.shards):
        state = zero.optimizer.state[shard]
        for key in ("exp_avg", "exp_avg_sq"):
            full = torch.empty(u.padded_numel, dtype=shard.dtype, device=shard.device)   # (N·S,)
            all_gather_single(full, state[key].contiguous(), group=zero.group)
            out[key].append(full[:u.numel])
        out["step"].append(float(state["step"]))
    return {"exp_avg": torch.cat(out["exp_avg"]), "exp_avg_sq": torch.cat(out["exp_avg_sq"]), "step": out["step"]}
