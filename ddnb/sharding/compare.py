"""The same GPT trained with plain data parallel (torch DDP), ZeRO 1/2/3 and torch FSDP2.

Every strategy starts from the same weights (`ddnb.models.gpt(config, seed)`), sees the
same global batches (`ddnb.models.synthetic_task`), each rank its 1/N of the rows, and
runs Adam; so after any number of steps all of them must hold the same parameters, up
to float rounding (the order of the sums differs). `train_gpt` runs one of them on every
rank of a group and returns the losses, the final parameters and the bytes this rank
held after its last step, and the bytes it sent per step (`sent_bytes`: counted in each
ZeRO wrapper's collectives, and for DDP in a comm hook around its own bucket all-reduce).
`expected_state_bytes` is what ddnb's ZeRO *should* hold, to
the byte: the formula of Rajbhandari et al. 2020, Sec. 5 (Figure 1) in fp32 (4-byte
parameters and gradients, K = 8 for Adam's two moments) with each layer padded to a
multiple of N (`ddnb.sharding.flat`). Taught in `notebooks/11_memory_sharding.ipynb`.

    r = train_gpt("zero2", GPTConfig(n_layers=2), steps=10)      # on every rank
    r["losses"], r["params"], r["memory"]
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ddnb._checks import Checks, is_int
from ddnb.memory import tensor_bytes
from ddnb.models import GPTConfig, gpt, lm_loss, synthetic_task
from ddnb.sharding.flat import shard_numel
from ddnb.sharding.zero1 import ZeroStage1, adam_state_bytes, ring_bytes_sent, validate_adam
from ddnb.sharding.zero2 import ZeroStage2
from ddnb.sharding.zero3 import ZeroStage3

ZERO = {"zero1": ZeroStage1, "zero2": ZeroStage2, "zero3": ZeroStage3}
STRATEGIES = ("ddp",) + tuple(ZERO) + ("fsdp2",)


def expected_state_bytes(unit_numels: list[int], world_size: int, stage: int, dtype_bytes: int = 4,
                         k: int = 8) -> dict:
    """Bytes of parameters, gradients and Adam state one rank of ddnb's ZeRO `stage` holds
    after a step: Ψ = Σ numel_u, S = Σ ceil(numel_u / N) (each layer padded to N·S_u):

        stage 0 (DDP)   4Ψ        4Ψ        8Ψ
        stage 1         4·N·S     4·N·S     8S      (flat buffers are padded)
        stage 2         4·N·S     4S        8S
        stage 3         4S        4S        8S
    """
    with Checks("expected_state_bytes") as check:
        check.integers("unit_numels", unit_numels, min=1)
        check.integer("world_size", world_size, min=1)
        check.integer("stage", stage, min=0, max=3)
    psi = sum(unit_numels)
    s = sum(shard_numel(n, world_size) for n in unit_numels)
    b = dtype_bytes
    if stage == 0:
        return {"parameters": b * psi, "gradients": b * psi, "optimizer": k * psi}
    padded = world_size * s
    return {"parameters": b * (s if stage == 3 else padded),
            "gradients": b * (s if stage >= 2 else padded),
            "optimizer": k * s}


def _local(t):
    """A DTensor's local shard (FSDP2), else the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def fsdp2_memory(model, optimizer) -> dict:
    """Bytes of this rank's local shards under FSDP2: parameters, gradients, Adam moments."""
    params = list(model.parameters())
    return {"parameters": tensor_bytes(_local(p) for p in params),
            "gradients": tensor_bytes(_local(p.grad) for p in params if p.grad is not None),
            "optimizer": tensor_bytes(_local(v) for s in optimizer.state.values() for key, v in s.items()
                                      if key != "step" and torch.is_tensor(v))}


def counted_allreduce_hook(state, bucket):   # no annotations: DDP checks them, and here they are strings
    """A DDP comm hook (bucket: dist.GradBucket -> Future[Tensor]): torch's own
    `allreduce_hook` (divide by N, sum; DDP's result unchanged) on one gradient bucket,
    adding the bytes this rank sends on a ring to state = (group, sent)'s sent["all_reduce"]."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    group, sent = state
    buf = bucket.buffer()                                               # (numel,) the bucket
    sent["all_reduce"] += ring_bytes_sent("all_reduce", buf.numel() * buf.element_size(),
                                          dist.get_world_size(group))
    return allreduce_hook(group, bucket)


def validate_run(strategy, batch_size, world_size, steps, check: Checks) -> None:
    """train_gpt's strategy, batch (a multiple of world_size) and steps: added to `check`."""
    check.choice("strategy", strategy, STRATEGIES)
    check.rule(is_int(batch_size) and batch_size >= 1 and batch_size % world_size == 0,
               f"batch_size({batch_size!r}) must be a positive multiple of world_size({world_size}): "
               f"each rank takes batch_size / world_size rows")
    check.integer("steps", steps, min=1)


def train_gpt(strategy: str, config: GPTConfig | None = None, steps: int = 10, batch_size: int = 8,
              lr: float = 1e-2, eps: float = 1e-8, seed: int = 0, group=None) -> dict:
    """Train `gpt(config, seed)` for `steps` Adam steps with `strategy` ("ddp", "zero1",
    "zero2", "zero3" or "fsdp2"), on every rank of `group`. Returns {"strategy", "losses"
    (the global-batch mean loss per step), "params" (all parameters (Ψ,) after training,
    model order), "memory" (bytes this rank held after the last step, before zero_grad),
    "num_params", "unit_numels", "sent_bytes" (bytes this rank sent per step, by collective,
    as a ring sends them: `ddnb.sharding.ring_bytes_sent`; not counted for fsdp2)} and, for
    zero3, "peak_full_param_bytes".

    A caution when comparing strategies: attention's key bias gets a gradient that is zero
    in exact arithmetic (softmax is unchanged by adding q·b_k to every score of a row), so
    what it receives is float rounding, which differs with the order of the sums; Adam
    divides by √v + eps and turns that noise into steps of up to lr. An eps well above the
    noise (1e-6 rather than 1e-8) keeps such parameters still and the comparison exact to 1e-5."""
    config = GPTConfig() if config is None else config
    world_size, rank = dist.get_world_size(group), dist.get_rank(group)
    with Checks("train_gpt") as check:
        validate_run(strategy, batch_size, world_size, steps, check)
        validate_adam(lr, (0.9, 0.999), eps, check)
    model = gpt(config, seed=seed)
    unit_numels = [sum(p.numel() for p in m.parameters()) for m in model.children()]
    b = batch_size // world_size
    batches = [(x[rank * b:(rank + 1) * b], y[rank * b:(rank + 1) * b])
               for x, y in synthetic_task(config, batch_size, steps, seed)]      # (b, T) each
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        wrapped = DDP(model, process_group=group)
        sent = {"all_reduce": 0.0}
        wrapped.register_comm_hook((group, sent), counted_allreduce_hook)
        opt = torch.optim.Adam(model.parameters(), lr=lr, eps=eps, foreach=False)
    elif strategy == "fsdp2":
        from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world_size,)) if group is None else DeviceMesh.from_group(group, "cpu")
        for block in list(model.children()):
            fully_shard(block, mesh=mesh)          # one all-gather per layer, as ddnb's units
        wrapped = fully_shard(model, mesh=mesh)
        opt = torch.optim.Adam(model.parameters(), lr=lr, eps=eps, foreach=False)
    else:
        wrapped = ZERO[strategy](model, lr=lr, eps=eps, group=group)
        opt, sent = wrapped, wrapped.sent_bytes
    losses = []
    for step, (x, y) in enumerate(batches):
        loss = lm_loss(wrapped(x), y)
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean, group=group)
        losses.append(mean.item() / world_size)
        if step == steps - 1:
            if strategy == "ddp":
                memory = {"parameters": tensor_bytes(model.parameters()),
                          "gradients": tensor_bytes(p.grad for p in model.parameters()),
                          "optimizer": adam_state_bytes(opt)}
            elif strategy == "fsdp2":
                memory = fsdp2_memory(model, opt)
            else:
                memory = wrapped.memory()
        opt.zero_grad()
    if strategy == "fsdp2":
        params = torch.cat([p.full_tensor().detach().reshape(-1) for p in model.parameters()])
    elif strategy == "ddp":
        params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    else:
        params = wrapped.full_parameters()
    out = {"strategy": strategy, "losses": losses, "params": params, "memory": memory,
           "num_params": sum(unit_numels), "unit_numels": unit_numels}
    if strategy != "fsdp2":
        out["sent_bytes"] = {k: v / steps for k, v in sent.items()}
    if strategy == "zero3":
        out["peak_full_param_bytes"] = wrapped.peak_full_param_bytes
    return out
