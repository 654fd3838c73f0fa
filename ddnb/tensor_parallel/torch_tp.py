"""The same split with PyTorch's own tensor parallelism (torch.distributed.tensor.parallel),
for comparison with ddnb's layers.

PyTorch expresses Megatron's column / row split as placements of DTensors on a
DeviceMesh: `ColwiseParallel` shards a Linear's weight on dim 0 (Shard(0): output
features) and takes a replicated input, `RowwiseParallel` shards it on dim 1 (input
features), takes an input sharded on its last dim and all-reduces its output (a Partial
placement redistributed to Replicate). `parallelize_module` applies them by submodule
name; here to ddnb.models.MLP's `fc` and `proj`, giving the same f -> fc_r -> GELU ->
proj_r -> g as `ddnb.tensor_parallel.TensorParallelMLP`. Taught in
`notebooks/10_tensor_parallelism.ipynb`.
"""
from __future__ import annotations

import copy

from torch import nn


def torch_tp_mlp(mlp: nn.Module, group, device_type: str = "cpu") -> nn.Module:
    """A copy of `mlp` (fc, act, proj) parallelized by torch over the ranks of `group`:
    fc ColwiseParallel, proj RowwiseParallel, on DeviceMesh.from_group(group)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = DeviceMesh.from_group(group, device_type)
    return parallelize_module(copy.deepcopy(mlp), mesh, {"fc": ColwiseParallel(), "proj": RowwiseParallel()})


def local_grads(module: nn.Module) -> dict:
    """{name: this rank's gradient shard} (DTensor gradients as their local tensors)."""
    out = {}
    for name, p in module.named_parameters():
        g = p.grad
        out[name] = None if g is None else (g.to_local() if hasattr(g, "to_local") else g).detach().clone()
    return out
