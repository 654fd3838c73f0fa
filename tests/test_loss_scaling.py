"""Dynamic loss scaling (ddnb/compression/loss_scaling.py): an overflow is detected, the
step skipped and the scale halved; on fp32 parameters the scaler equals
torch.amp.GradScaler("cpu") step for step; fp16 training with fp32 master weights learns."""
import pytest
import torch
import torch.nn.functional as F

from ddnb.compression.loss_scaling import DynamicLossScaler, train_fp16
from ddnb.compression.precision import MasterWeights
from ddnb.data import batch, digits
from ddnb.models import flat_params, mlp


def _fp16_model():
    return mlp((64, 32, 10), seed=1).to(torch.float16)


def test_overflow_skips_the_step_and_halves_the_scale():
    train, _ = digits(seed=0)
    model = _fp16_model()
    opt = MasterWeights(model.parameters(), torch.optim.SGD, lr=0.1, momentum=0.9)
    scaler = DynamicLossScaler(init_scale=2.0 ** 30, growth_interval=1000)
    x, y = batch(train, 64, 0)
    before, masters = flat_params(model), [m.clone() for m in opt.masters]
    loss = F.cross_entropy(model(x.half()).float(), y)
    scaler.scale(loss).backward()
    assert not all(torch.isfinite(p.grad).all() for p in model.parameters())     # 2^30 · g overflowed fp16
    assert scaler.step(opt) is False and scaler.skipped == 1
    assert scaler.update() == 2.0 ** 29
    assert torch.equal(flat_params(model), before)                             # step skipped: nothing moved
    assert all(torch.equal(a, b) for a, b in zip(opt.masters, masters))
    assert not opt.optimizer.state                                             # momentum untouched too
    opt.zero_grad()
    # at a sane scale the same batch goes through and moves the weights
    scaler.scale_value = 2.0 ** 8
    scaler.scale(F.cross_entropy(model(x.half()).float(), y)).backward()
    assert scaler.step(opt) is True and scaler.update() == 2.0 ** 8
    assert not torch.equal(flat_params(model), before)


def test_training_backs_off_until_no_overflow_then_learns():
    r = train_fp16(steps=40, init_scale=2.0 ** 30, growth_interval=10)
    scales = [2.0 ** 30] + r["scales"]
    assert scales[1] == 2.0 ** 29 and r["skipped"] >= 1           # 2^30 overflows at once
    ratios = [b / a for a, b in zip(scales, scales[1:])]
    assert set(ratios) <= {0.5, 1.0, 2.0} and ratios.count(0.5) == r["skipped"]   # one halving per skip
    assert r["losses"][-1] < 0.5 * r["losses"][0] and r["accuracy"] > 0.85


def _run(scaler_kind: str, steps: int, inf_at: set, growth_interval: int):
    train, _ = digits(seed=0)
    model = mlp((64, 32, 10), seed=2)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = (torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=growth_interval)
              if scaler_kind == "torch" else DynamicLossScaler(2.0 ** 10, growth_interval=growth_interval))
    scales = []
    for t in range(steps):
        x, y = batch(train, 32, t)
        loss = F.cross_entropy(model(x), y)
        if t in inf_at:
            loss = loss * float("inf")                      # an overflow, as fp16 would make
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
        opt.zero_grad()
    return scales, flat_params(model)


def test_equals_torch_grad_scaler():
    ours, p_ours = _run("ddnb", 12, {2, 3, 9}, growth_interval=3)
    theirs, p_theirs = _run("torch", 12, {2, 3, 9}, growth_interval=3)
    assert ours == theirs
    # overflows at 2, 3 and 9 halve; 3 good steps in a row (4, 5, 6) double
    assert ours == [2.0 ** k for k in (10, 10, 9, 8, 8, 8, 9, 9, 9, 8, 8, 8)]
    assert torch.allclose(p_ours, p_theirs, atol=1e-6)


def test_bad_settings_named():
    with pytest.raises(ValueError) as e:
        DynamicLossScaler(init_scale=0, growth_factor=0.5, backoff_factor=1.5, growth_interval=0)
    for name in ("init_scale", "growth_factor", "backoff_factor", "growth_interval"):
        assert name in str(e.value)
    with pytest.raises(RuntimeError, match="step"):
        DynamicLossScaler().update()
