"""Mixed precision on CPU: compute in bf16, keep fp32 master weights, send gradients in
bf16, and measure what each part costs per rank (Micikevicius et al., "Mixed Precision
Training", ICLR 2018, Sec. 3.1 "FP32 master copy of weights"; Kalamkar et al., "A Study of
BFLOAT16 for Deep Learning Training", 2019, for bf16, whose fp32 range needs no loss
scaling).

Three ways to train the same model, `train_precision(mode)`:

    "fp32"      fp32 weights, gradients, activations; Adam            4 + 4 + 8 bytes/param
    "autocast"  fp32 weights (they are the master weights), forward and backward under
                torch.autocast("cpu", bfloat16): matmuls in bf16, activations saved in
                bf16; gradients fp32, sent in bf16 (ddnb's bf16_hook: 2 bytes/element)
    "bf16"      the model itself in bf16 (weights 2, gradients 2 bytes/param, so DDP's
                buckets, and its all-reduce, are bf16), and `MasterWeights`: an fp32
                copy of every weight that Adam updates (4 + 8), copied back to bf16
                after each step                                       2 + 2 + 12 bytes/param

The 2 + 2 + 12 = 16 bytes per parameter of mixed-precision Adam (Rajbhandari et al. 2020,
"ZeRO", Sec. 3.1; `ddnb.cost.memory_model.state_bytes_per_param("mixed", "adam")`) is
checked against `ddnb.memory`'s measurement. Activations: autocast saves bf16
activations but also the bf16 copy of each weight it casts for the matmuls (not
parameters, so they count as saved tensors): on a small MLP that is more than fp32's
activations; "bf16" saves half of fp32's. In states, "bf16" holds exactly 2Ψ, 2Ψ and 12Ψ bytes,
plus Adam's step counter, one 4-byte scalar per tensor. Why keep the fp32 copy: an update
lr·g smaller than half a bf16 step of the weight (2^-8 relative) rounds away entirely, so
pure bf16 weights stop learning; the fp32 master adds it up (`tests/test_precision.py`).
Taught in `notebooks/14_precision_compression.ipynb`.

    model = mlp(...).to(torch.bfloat16)
    opt = MasterWeights(model.parameters(), torch.optim.Adam, lr=1e-3)
    loss.backward(); opt.step(); opt.zero_grad()
"""
from __future__ import annotations

import torch

from ddnb._checks import Checks

MODES = ("fp32", "autocast", "bf16")


class MasterWeights:
    """An optimizer over fp32 master copies of low-precision parameters: step() copies
    each p.grad to fp32, runs `optimizer_cls` on the masters, and writes the masters back
    into the parameters (rounded to their dtype)."""

    def __init__(self, params, optimizer_cls=torch.optim.Adam, **kwargs):
        self.params = [p for p in params if p.requires_grad]
        self.masters = [p.detach().float().clone().requires_grad_(True) for p in self.params]   # fp32 copies
        self.optimizer = optimizer_cls(self.masters, **kwargs)

    @torch.no_grad()
    def step(self) -> None:
        for p, m in zip(self.params, self.masters):
            m.grad = None if p.grad is None else p.grad.float()        # transient: freed after the step
        self.optimizer.step()
        for p, m in zip(self.params, self.masters):
            m.grad = None
            p.copy_(m)                                                 # fp32 -> bf16, rounded

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def state_tensors(self):
        """The masters and the inner optimizer's state: the optimizer's memory."""
        yield from self.masters
        for state in self.optimizer.state.values():
            yield from (v for v in state.values() if torch.is_tensor(v))


def memory_per_rank(model, optimizer, activations: int) -> dict:
    """{"parameters", "gradients", "optimizer", "activations", "total"} in bytes; the
    optimizer's part counts MasterWeights' fp32 copies too."""
    from ddnb.memory import model_memory, tensor_bytes

    mem = model_memory(model, None if isinstance(optimizer, MasterWeights) else optimizer)
    if isinstance(optimizer, MasterWeights):
        mem["optimizer"] = tensor_bytes(optimizer.state_tensors())
    mem["activations"] = activations
    mem["total"] = sum(mem.values())
    return mem


def train_precision(mode: str = "fp32", steps: int = 60, per_rank: int = 32, hidden=(256, 256), lr: float = 1e-3,
                    seed: int = 0, model: str = "mlp") -> dict:
    """Train with Adam in `mode` (MODES) with DDP on every rank of an initialized world
    (same seed, data and steps for every mode) the digits MLP (model="mlp", `hidden`) or
    the small GPT of chapter 08 on its sequence-reversal task (model="gpt", `GPTConfig()`);
    returns {"losses", "accuracy" (test accuracy; the GPT's: next-token accuracy on a
    batch it never trained on), "memory": memory_per_rank after the last step
    (activations: the peak autograd held in a step), "params": the number Ψ of
    parameters, "tensors", "grad_dtype", "bytes_per_step": bytes one rank hands to the
    gradient all-reduce}."""
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from ddnb.compression import bf16_hook
    from ddnb.compression.comm import bytes_per_step
    from ddnb.compression.half import HookState, allreduce_hook
    from ddnb.data import batch_indices, digits
    from ddnb.memory import SavedActivations
    from ddnb.models import IGNORE, GPTConfig, accuracy, gpt, lm_loss, mlp, synthetic_task
    from ddnb.trace import Tracer

    with Checks("train_precision") as check:
        check.choice("mode", mode, MODES)
        check.choice("model", model, ("mlp", "gpt"))
        check.positive_ints(steps=steps, per_rank=per_rank)
        check.number("lr", lr, positive=True)
    rank, n = dist.get_rank(), dist.get_world_size()
    kind, dtype = model, (torch.bfloat16 if mode == "bf16" else torch.float32)
    mine = slice(rank * per_rank, (rank + 1) * per_rank)           # this rank's part of a global batch
    if kind == "mlp":
        train_set, test_set = digits(seed=0)
        net = mlp((64,) + tuple(hidden) + (10,), seed=seed)

        def batch(t):
            idx = batch_indices(len(train_set), n * per_rank, t, seed)[mine]
            return train_set.x[idx].to(dtype), train_set.y[idx]                  # (B, 64), (B,)
        loss_of = F.cross_entropy
    else:
        cfg = GPTConfig()
        net, data = gpt(cfg, seed=seed), synthetic_task(cfg, n * per_rank, steps, seed)

        def batch(t):
            idx, targets = data[t]                                                # (N·B, T), (N·B, T)
            return idx[mine], targets[mine]
        loss_of = lm_loss
    model = net.to(dtype)
    tracer = Tracer()
    ddp = DistributedDataParallel(model)
    # fp32 gradients go out as bf16 under autocast; bf16 gradients are bf16 already
    ddp.register_comm_hook(HookState(None, tracer), bf16_hook if mode == "autocast" else allreduce_hook)
    opt = MasterWeights(model.parameters(), torch.optim.Adam, lr=lr) if mode == "bf16" else \
        torch.optim.Adam(model.parameters(), lr=lr)
    acts = SavedActivations(ignore=list(model.parameters()))
    losses = []
    for t in range(steps):
        x, y = batch(t)
        opt.zero_grad()
        acts.reset_peak()
        with acts, torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "autocast"):
            loss = loss_of(ddp(x).float(), y)                             # the loss in fp32
        loss.backward()
        opt.step()
        losses.append(loss.item())
    grad_dtype = next(model.parameters()).grad.dtype
    memory = memory_per_rank(model, opt, acts.peak)
    model.float().eval()
    if kind == "gpt":
        idx, targets = synthetic_task(cfg, 256, 1, seed + 1)[0]                 # a batch never trained on
        with torch.no_grad():
            hit = (model(idx).argmax(-1) == targets)[targets != IGNORE]
        test_accuracy = hit.float().mean().item()
    else:
        test_accuracy = accuracy(model, test_set)
    return {"losses": losses, "accuracy": test_accuracy, "memory": memory,
            "params": sum(p.numel() for p in model.parameters()), "tensors": len(list(model.parameters())),
            "grad_dtype": str(grad_dtype), "bytes_per_step": bytes_per_step(tracer.take())}
