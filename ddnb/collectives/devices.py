"""Where a rank's tensors and messages live, one rule each, decided by the process group:

    device_for(backend, local_rank)   a rank's device: cuda:local_rank when its group has nccl, else the CPU
    rank_device()                     this rank's device, from its process group
    header_device(group)              where the small messages every rank sends live (the group decides)
    wire_device(tensor, group)        where a tensor's messages travel (gloo reads host memory only)

torch.distributed's backends: gloo carries host (and, for collectives, CUDA) tensors,
nccl CUDA tensors only, and "cpu:gloo,cuda:nccl" each kind on its own backend. Used by
the collectives, the algorithms above them and the runtime (`ddnb.runtime.worker`).
Taught in `notebooks/03_collectives.ipynb`.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def device_for(backend: str, local_rank: int):
    """The device a rank puts its tensors on: cuda:local_rank when its process group has
    nccl ("nccl" or GPU_BACKEND), else the CPU."""
    return torch.device("cuda", local_rank) if "nccl" in str(backend) else torch.device("cpu")


def rank_device():
    """The device this rank's tensors belong on, from its process group, in any ddnb
    process (an engine, a `ddnb.testing.World` rank, `ddnb.launch` under a launcher): its
    current GPU when the group has nccl, else the CPU (also before any group exists)."""
    if dist.is_available() and dist.is_initialized() and "nccl" in str(dist.get_backend()):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def header_device(group=None) -> torch.device:
    """Where a small message that every rank of `group` sends (a check's header, a
    parameter server's header) lives: the host on a group that carries host tensors (gloo,
    and "cpu:gloo,cuda:nccl", whose CPU tensors go over gloo), this rank's GPU on a pure
    nccl group (nccl carries CUDA tensors only). It depends on the group alone, never on
    the arguments, so a rank with bad arguments sends on the same backend as the others
    (a CPU header from one rank and CUDA ones from the rest would meet on two backends)."""
    if str(dist.get_backend(group)) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def wire_device(tensor: torch.Tensor, group=None) -> torch.device:
    """Where the messages' buffers must live: the tensor's own device, except that gloo's
    point-to-point messages read host memory only (ProcessGroupGloo::send hands the
    tensor's data pointer to TCP), so a CUDA tensor on a gloo group travels via the host."""
    if tensor.device.type != "cpu" and dist.get_backend(group) == "gloo":
        return torch.device("cpu")
    return tensor.device
