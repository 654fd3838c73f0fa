"""ddnb.compression.precision: bf16 autocast and bf16 weights with fp32 master weights on
CPU, gradients sent in bf16 (traced bytes), memory per rank measured against the
2 + 2 + 12 bytes per parameter formula, final loss against fp32."""
import pytest
import torch

from ddnb.compression.precision import MasterWeights, train_precision
from ddnb.cost.memory_model import state_bytes_per_param


def _all_modes():
    return {m: train_precision(m, steps=40) for m in ("fp32", "autocast", "bf16")}


def test_memory_bytes_and_loss_per_mode(world):
    got = world(2).run(_all_modes)[0]
    psi, tensors = got["fp32"]["params"], got["fp32"]["tensors"]       # 85,002 parameters in 6 tensors
    step_counters = 4 * tensors                                        # Adam's step: one fp32 scalar per tensor
    for mode, precision in (("fp32", "fp32"), ("bf16", "mixed")):
        p, g, k = state_bytes_per_param(precision, "adam")            # (4, 4, 8) and (2, 2, 12)
        mem = got[mode]["memory"]
        assert (mem["parameters"], mem["gradients"], mem["optimizer"]) == (p * psi, g * psi, k * psi + step_counters)
        assert p + g + k == 16
    assert got["bf16"]["grad_dtype"] == "torch.bfloat16" and got["autocast"]["grad_dtype"] == "torch.float32"
    for mode, per_element in (("fp32", 4), ("autocast", 2), ("bf16", 2)):   # what the all-reduce carries
        assert set(got[mode]["bytes_per_step"].values()) == {per_element * psi}
    assert 0 < got["bf16"]["memory"]["activations"] < got["fp32"]["memory"]["activations"]
    for mode in ("autocast", "bf16"):                                  # close to fp32 after 40 steps
        assert abs(got[mode]["losses"][-1] - got["fp32"]["losses"][-1]) < 0.05
        assert abs(got[mode]["accuracy"] - got["fp32"]["accuracy"]) <= 0.02
    assert got["fp32"]["losses"][-1] < 0.5 * got["fp32"]["losses"][0]


def test_master_weights_keep_updates_that_bf16_rounds_away():
    w = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    plain = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    master, sgd = MasterWeights([w], torch.optim.SGD, lr=1e-3), torch.optim.SGD([plain], lr=1e-3)
    for _ in range(100):                                               # each update 1e-3 < half a bf16 step at 1.0
        for p, opt in ((w, master), (plain, sgd)):
            opt.zero_grad()
            p.grad = torch.ones(4, dtype=torch.bfloat16)
            opt.step()
    assert torch.equal(plain, torch.ones(4, dtype=torch.bfloat16))     # pure bf16: not one update landed
    assert abs(master.masters[0][0].item() - 0.9) < 1e-5 and abs(w[0].item() - 0.9) < 4e-3


def test_bad_mode_named():
    with pytest.raises(ValueError, match=r"mode='fp8' is not one of \('fp32', 'autocast', 'bf16'\); steps=0"):
        train_precision("fp8", steps=0)


def _gpt_modes():
    return {m: train_precision(m, steps=200, per_rank=16, lr=3e-3, model="gpt") for m in ("fp32", "autocast", "bf16")}


def test_the_small_gpt_in_bf16_learns_as_fp32_does(world):
    """The same comparison on chapter 08's GPT (sequence reversal): bf16 gradients on the
    wire, 2 + 2 + 12 bytes per parameter with master weights, and a final loss and
    next-token accuracy close to fp32's."""
    got = world(2).run(_gpt_modes)[0]
    psi, tensors = got["fp32"]["params"], got["fp32"]["tensors"]
    mem = got["bf16"]["memory"]
    assert (mem["parameters"], mem["gradients"], mem["optimizer"]) == (2 * psi, 2 * psi, 12 * psi + 4 * tensors)
    for mode, per_element in (("fp32", 4), ("autocast", 2), ("bf16", 2)):
        assert set(got[mode]["bytes_per_step"].values()) == {per_element * psi}
    for mode in ("fp32", "autocast", "bf16"):    # each one learns the task: loss 2.77 -> ~0.01 in 200 steps
        assert got[mode]["losses"][-1] < 0.1 and got[mode]["accuracy"] >= 0.99, (mode, got[mode]["losses"][-1])
