"""fp16 training with dynamic loss scaling and fp32 master weights (Micikevicius et al.,
"Mixed Precision Training", ICLR 2018, Sec. 3.2 "Loss scaling"; the dynamic schedule is
NVIDIA's, as in torch.amp.GradScaler).

fp16 has 5 exponent bits: its smallest normal number is 2^-14 (subnormals reach 2^-24) and
its largest 65504. Small gradients underflow to 0 in fp16, so the loss is multiplied by a
scale S before backward (every gradient is then S times larger, by the chain rule), and
the fp32 copy of each gradient is divided by S before the optimizer sees it:

    backward(S · L)  ->  g16 = fp16(S · ∂L/∂w)  ->  g32 = fp32(g16) / S  ->  step(g32)

S is chosen dynamically: if any g16 is inf or nan (S was too large: S·g overflowed 65504),
the step is skipped (weights and optimizer state untouched) and S ← S · backoff (0.5);
after `growth_interval` overflow-free steps in a row, S ← S · growth (2). So S hovers just
below the largest value that does not overflow. bf16 (8 exponent bits, fp32's range) needs
none of this (`precision.py`).

    model = mlp(...).to(torch.float16)
    opt = MasterWeights(model.parameters(), torch.optim.SGD, lr=0.05)   # fp32 masters
    scaler = DynamicLossScaler()
    scaler.scale(loss).backward(); scaler.step(opt); scaler.update(); opt.zero_grad()

`DynamicLossScaler` takes a `MasterWeights` (the gradients are the fp16 parameters' and
are unscaled into the fp32 masters) or any torch optimizer over fp32 parameters; on the
latter it behaves as torch.amp.GradScaler("cpu") does (same scales, same skipped steps,
same parameters: tests/test_loss_scaling.py). Taught in
`notebooks/14_precision_compression.ipynb`.
"""
from __future__ import annotations

import torch

from ddnb._checks import Checks
from ddnb.compression.precision import MasterWeights


class DynamicLossScaler:
    """Dynamic loss scaling: scale(loss), then step(optimizer) (skipped on inf/nan), then
    update(). The defaults are torch.amp.GradScaler's."""

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000):
        with Checks("DynamicLossScaler") as check:
            check.number("init_scale", init_scale, positive=True)
            check.number("growth_factor", growth_factor, min=1)
            check.number("backoff_factor", backoff_factor, positive=True, below=1)
            check.integer("growth_interval", growth_interval, min=1)
        self.scale_value = float(init_scale)
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self.good_steps = 0            # overflow-free steps since the scale last changed
        self.found_inf = None          # set by step(), read by update()
        self.skipped = 0               # steps skipped so far

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """S · loss (a new tensor; backward through it gives S times the gradients)."""
        return loss * self.scale_value

    def get_scale(self) -> float:
        return self.scale_value

    @torch.no_grad()
    def unscale(self, optimizer) -> bool:
        """Put the fp32 gradients / S where the optimizer reads them; True if any is inf/nan."""
        inv = 1.0 / self.scale_value
        found = False
        if isinstance(optimizer, MasterWeights):
            for p, m in zip(optimizer.params, optimizer.masters):
                m.grad = None if p.grad is None else p.grad.float() * inv          # fp16 -> fp32, / S
                found |= m.grad is not None and not bool(torch.isfinite(m.grad).all())
        else:
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad.mul_(inv)
                        found |= not bool(torch.isfinite(p.grad).all())
        return found

    def step(self, optimizer) -> bool:
        """Unscale, then run the optimizer's step unless a gradient overflowed; True if it ran."""
        self.found_inf = self.unscale(optimizer)
        if self.found_inf:
            self.skipped += 1
            if isinstance(optimizer, MasterWeights):
                for m in optimizer.masters:
                    m.grad = None
            return False
        if isinstance(optimizer, MasterWeights):
            optimizer.optimizer.step()                    # the masters' own optimizer, on g32 / S
            with torch.no_grad():
                for p, m in zip(optimizer.params, optimizer.masters):
                    m.grad = None
                    p.copy_(m)                            # fp32 -> fp16, rounded
        else:
            optimizer.step()
        return True

    def update(self) -> float:
        """Back off after an overflow, grow after growth_interval good steps; the new S."""
        if self.found_inf is None:
            raise RuntimeError("DynamicLossScaler.update: call step(optimizer) first")
        if self.found_inf:
            self.scale_value *= self.backoff_factor
            self.good_steps = 0
        else:
            self.good_steps += 1
            if self.good_steps == self.growth_interval:
                self.scale_value *= self.growth_factor
                self.good_steps = 0
        self.found_inf = None
        return self.scale_value


def train_fp16(steps: int = 60, batch_size: int = 64, lr: float = 0.05, seed: int = 0, init_scale: float = 2.0 ** 16,
               growth_interval: int = 20, scaling: bool = True) -> dict:
    """Train the digits MLP with fp16 weights and activations, fp32 master weights and SGD
    (momentum 0.9), with dynamic loss scaling (or `scaling=False`: none). Returns
    {"losses", "scales" (S after each step), "skipped" (steps skipped), "accuracy",
    "zero_grads" (fraction of fp16 gradient elements that are exactly 0, last step)}."""
    import torch.nn.functional as F

    from ddnb.data import batch, digits
    from ddnb.models import accuracy, mlp

    with Checks("train_fp16") as check:
        check.positive_ints(steps=steps, batch_size=batch_size)
    train, test = digits(seed=0)
    model = mlp((64, 128, 10), seed=seed).to(torch.float16)
    opt = MasterWeights(model.parameters(), torch.optim.SGD, lr=lr, momentum=0.9)
    scaler = DynamicLossScaler(init_scale, growth_interval=growth_interval) if scaling else \
        DynamicLossScaler(1.0, growth_factor=1.0, backoff_factor=0.5)   # S = 1: no scaling (skips on overflow)
    losses, scales = [], []
    for t in range(steps):
        x, y = batch(train, batch_size, t, seed)
        loss = F.cross_entropy(model(x.half()).float(), y)                 # logits fp16 -> fp32 loss
        scaler.scale(loss).backward()
        zero = sum(int((p.grad == 0).sum()) for p in model.parameters()) / sum(p.numel() for p in model.parameters())
        scaler.step(opt)
        scales.append(scaler.update())
        opt.zero_grad()
        losses.append(loss.item())
    test16 = type(test)(test.x.half(), test.y)
    return {"losses": losses, "scales": scales, "skipped": scaler.skipped, "accuracy": accuracy(model, test16),
            "zero_grads": zero}
