"""ddnb.sharding: ZeRO stages 1, 2 and 3 train a GPT to the parameters of torch DDP
(1e-5) after 10 Adam steps on 2 and 4 ranks, and so does torch FSDP2 (fully_shard); the
bytes each rank holds (parameters, gradients, Adam moments) equal the fp32 formula
exactly, padding included; the bytes each rank sends per step are a ring all-reduce's of
the (padded) flat buffers for stages 1 and 2 (a reduce-scatter and an all-gather: exactly
DDP's traced bytes when nothing is padded) and 1.5x that for stage 3;
stage 2 keeps no full gradient after backward; stage 3 holds one layer's full parameters
at a time and frees them after forward and after backward (measured); the flat layout is
views of one padded buffer; activation checkpointing gives the same gradients with fewer
saved bytes; bad input raises ValueError before any collective.

The model has odd sizes (d_model=30, vocab 15) so that layers do not divide by 4 and the
padding of the flat shards is exercised. One World.run per world size trains all five
strategies; the tests below read its results.
"""
import pytest
import torch
from torch import nn

from ddnb.runtime.errors import WorkerError
from ddnb.models import GPTConfig, gpt, lm_loss, synthetic_task
from ddnb.cost import zero_comm_bytes
from ddnb.sharding import (FlatUnit, ZeroStage1, activation_cost, checkpoint_blocks, expected_state_bytes,
                           shard_numel)

CFG = GPTConfig(vocab_size=15, d_model=30, n_heads=3, n_layers=2)
STEPS, BATCH = 10, 8
LR, EPS = 3e-3, 1e-6   # eps above the rounding noise of the key bias's (exactly zero) gradient: see train_gpt
_runs: dict = {}


def _train_all(cfg, steps, batch, lr, eps):
    from ddnb.sharding import STRATEGIES, train_gpt

    return {s: train_gpt(s, cfg, steps=steps, batch_size=batch, lr=lr, eps=eps) for s in STRATEGIES}


@pytest.fixture(params=[2, 4], ids=["n2", "n4"])
def runs(request, world):
    n = request.param
    if n not in _runs:
        _runs[n] = world(n).run(_train_all, CFG, STEPS, BATCH, LR, EPS, timeout=300)
    return n, _runs[n]


@pytest.mark.parametrize("strategy", ["zero1", "zero2", "zero3", "fsdp2"])
def test_equals_ddp_after_10_steps(runs, strategy):
    n, per_rank = runs
    ref = per_rank[0]["ddp"]
    for rank in range(n):
        got = per_rank[rank][strategy]
        assert got["params"].shape == ref["params"].shape == (ref["num_params"],)
        torch.testing.assert_close(got["params"], ref["params"], rtol=0, atol=1e-5)
        assert got["losses"] == pytest.approx(ref["losses"], abs=1e-5)
    assert not torch.equal(ref["params"], torch.cat([p.detach().reshape(-1) for p in gpt(CFG).parameters()]))


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_state_bytes_equal_the_fp32_formula(runs, stage):
    n, per_rank = runs
    strategy = "ddp" if stage == 0 else f"zero{stage}"
    units = per_rank[0]["ddp"]["unit_numels"]
    assert any(u % 4 for u in units)                               # padding is exercised on 4 ranks
    for rank in range(n):
        assert per_rank[rank][strategy]["memory"] == expected_state_bytes(units, n, stage)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_bytes_sent_per_step_are_the_ring_formula(runs, stage):
    n, per_rank = runs
    units = per_rank[0]["ddp"]["unit_numels"]
    padded = 4 * n * sum(shard_numel(u, n) for u in units)          # ZeRO's flat buffers, N·S each
    f = (n - 1) / n                                                  # a ring phase sends (N-1)/N of the buffer
    expected = [{"all_reduce": 2 * f * 4 * sum(units)},              # DDP: its buckets hold every gradient
                {"reduce_scatter": f * padded, "all_gather": f * padded},
                {"reduce_scatter": f * padded, "all_gather": f * padded},
                {"reduce_scatter": f * padded, "all_gather": 2 * f * padded}][stage]
    for rank in range(n):
        sent = per_rank[rank]["ddp" if stage == 0 else f"zero{stage}"]["sent_bytes"]
        assert sent == pytest.approx(expected, rel=1e-12)
        assert sum(sent.values()) == pytest.approx(zero_comm_bytes(padded // 4 if stage else sum(units), n, stage,
                                                                   param_bytes=4, grad_bytes=4), rel=1e-12)


def _sent_bytes(cfg):
    from ddnb.sharding import train_gpt

    return {s: train_gpt(s, cfg, steps=2, batch_size=8)["sent_bytes"] for s in ("ddp", "zero1", "zero2", "zero3")}


def test_stages_1_and_2_send_exactly_what_ddp_sends(world):
    cfg = GPTConfig(n_layers=2)              # layers of 1024, 12704, 12704, 576 parameters: no padding on 4 ranks
    psi = sum(p.numel() for p in gpt(cfg).parameters())
    for sent in world(4).run(_sent_bytes, cfg):
        ddp = sent["ddp"]["all_reduce"]                              # traced in DDP's comm hook
        assert ddp == 2 * 3 / 4 * 4 * psi == 162048
        assert sum(sent["zero1"].values()) == sum(sent["zero2"].values()) == ddp
        assert sum(sent["zero3"].values()) == 1.5 * ddp


def test_stage3_peak_is_one_layer(runs):
    n, per_rank = runs
    units = per_rank[0]["ddp"]["unit_numels"]
    biggest = max(shard_numel(u, n) * n for u in units) * 4
    for rank in range(n):
        assert per_rank[rank]["zero3"]["peak_full_param_bytes"] == biggest


def test_fsdp2_holds_one_nth_of_each_parameter(runs):
    n, per_rank = runs
    model = gpt(CFG)
    # FSDP2 shards every parameter on dim 0, padded to a multiple of N rows
    # (storage padded; Adam's moments are made for the unpadded local rows)
    expected = sum(shard_numel(p.shape[0], n) * (p.numel() // p.shape[0]) * 4 for p in model.parameters())
    psi = sum(p.numel() for p in model.parameters())
    for rank in range(n):
        local = sum(max(0, min(shard_numel(p.shape[0], n), p.shape[0] - rank * shard_numel(p.shape[0], n)))
                    * (p.numel() // p.shape[0]) for p in model.parameters())
        mem = per_rank[rank]["fsdp2"]["memory"]
        assert mem["parameters"] == mem["gradients"] == expected
        assert mem["optimizer"] == 8 * local
        assert 4 * psi / n <= expected < 1.05 * 4 * psi / n


def _measure_stage3_and_2():
    import torch.distributed as dist

    from ddnb.sharding import ZeroStage2, ZeroStage3

    out = {}
    idx, targets = synthetic_task(CFG, 4, steps=1)[0]
    model = gpt(CFG)
    z3 = ZeroStage3(model, lr=1e-2)
    during = []
    for i, u in enumerate(z3.units):   # registered after the engine's pre-hook: runs after its gather
        u.module.register_forward_pre_hook(lambda m, a, i=i: during.append((i, [v.full_bytes() for v in z3.units])))
    out["at_rest"] = z3.full_param_bytes()
    loss = lm_loss(z3(idx), targets)
    out["during_forward"] = during
    out["after_forward"] = z3.full_param_bytes()
    loss.backward()
    out["after_backward"] = z3.full_param_bytes()
    out["gathers"] = z3.gathers
    out["module_grads"] = [p.grad for u in z3.units for p in u.params]
    out["shard_grads"] = [s.grad.numel() for s in z3.shards]
    out["unit_bytes"] = [u.padded_numel * 4 for u in z3.units]
    out["unit_numels"] = [u.numel for u in z3.units]
    z2 = ZeroStage2(gpt(CFG), lr=1e-2)
    lm_loss(z2(idx), targets).backward()
    out["z2_module_grads"] = [p.grad for u in z2.units for p in u.params]
    out["z2_peak_full_grad"] = z2.peak_full_grad_bytes
    out["z2_memory"] = z2.memory()
    out["world_size"] = dist.get_world_size()
    return out


def test_stage3_gathers_on_demand_and_frees_after_use(world):
    out = world(2).run(_measure_stage3_and_2)[1]
    units = len(out["unit_bytes"])
    assert out["at_rest"] == out["after_forward"] == out["after_backward"] == 0
    # while unit i runs forward, only unit i's full parameters exist
    assert [i for i, _ in out["during_forward"]] == list(range(units))
    for i, live in out["during_forward"]:
        assert live == [b if j == i else 0 for j, b in enumerate(out["unit_bytes"])]
    assert out["gathers"] == 2 * units                             # forward and backward, once each
    assert all(g is None for g in out["module_grads"])             # full gradients freed
    assert sum(out["shard_grads"]) * 2 == sum(b // 4 for b in out["unit_bytes"])


def test_stage2_keeps_only_the_gradient_shard(world):
    out = world(2).run(_measure_stage3_and_2)[0]
    assert all(g is None for g in out["z2_module_grads"])
    assert out["z2_memory"]["gradients"] == sum(b for b in out["unit_bytes"]) // 2
    # during backward one layer's full gradient exists at a time (unpadded: autograd's own)
    assert out["z2_peak_full_grad"] == 4 * max(out["unit_numels"])


def test_flat_unit_is_views_of_one_padded_buffer():
    layer = nn.Linear(3, 3)                                        # 12 parameters
    before = [p.detach().clone() for p in layer.parameters()]
    u = FlatUnit(layer, world_size=5, rank=2)
    assert (u.numel, u.shard_numel, u.padded_numel, u.lo, u.hi) == (12, 3, 15, 6, 9)
    for p, b in zip(layer.parameters(), before):
        assert torch.equal(p, b) and p.untyped_storage().data_ptr() == u.flat.untyped_storage().data_ptr()
    assert torch.equal(u.flat[12:], torch.zeros(3))
    u.flat[0] = 7.0
    assert layer.weight[0, 0].item() == 7.0
    u.free_full()
    assert u.full_bytes() == 0


def test_checkpointing_same_gradients_fewer_saved_bytes():
    cfg = GPTConfig(n_layers=2)
    plain = activation_cost(cfg, batch_size=8, checkpointed=False, repeats=1)
    ckpt = activation_cost(cfg, batch_size=8, checkpointed=True, repeats=1)
    torch.testing.assert_close(ckpt["grads"], plain["grads"], rtol=0, atol=1e-6)
    assert ckpt["loss"] == pytest.approx(plain["loss"], abs=1e-6)
    block_input = 8 * cfg.seq_len * cfg.d_model * 4
    assert cfg.n_layers * block_input <= ckpt["activations"] < plain["activations"] / 4
    with pytest.raises(ValueError, match="Block"):
        checkpoint_blocks(nn.Sequential(nn.Linear(2, 2)))


def test_bad_input_before_any_collective():
    model = gpt(CFG)
    # no process group exists in the test process: these must fail before touching one
    with pytest.raises(ValueError, match=r"^ZeroStage1: lr=-1: need a number > 0; eps=0: need a number > 0$"):
        ZeroStage1(model, lr=-1, eps=0)
    shared = nn.Linear(2, 2)
    with pytest.raises(ValueError,
                       match=r"in two units: \['0.weight \(units 0 and 1\)', '0.bias \(units 0 and 1\)'\], in none"):
        ZeroStage1(nn.Sequential(shared, nn.ReLU()), units=[shared, shared])
    with pytest.raises(ValueError, match=r"in none: \['1.weight', '1.bias'\]"):
        ZeroStage1(nn.Sequential(shared, nn.Linear(2, 2)), units=[shared])
    with pytest.raises(ValueError, match=r"stage=4"):
        expected_state_bytes([10], 2, 4)
    with pytest.raises(ValueError, match=r"^expected_state_bytes: unit_numels=\[\]: need a non-empty list of "
                                         r"integers >= 1; world_size=0: need an integer >= 1; "
                                         r"stage=4: need an integer >= 0 and <= 3$"):
        expected_state_bytes([], 0, 4)


def _bad_run(kwargs):
    from ddnb.sharding import train_gpt

    return train_gpt(**kwargs)


@pytest.mark.parametrize("kwargs, message", [
    (dict(strategy="zero4"), r"strategy='zero4' is not one of \('ddp', 'zero1', 'zero2', 'zero3', 'fsdp2'\)"),
    (dict(strategy="zero1", batch_size=3), r"batch_size\(3\) must be a positive multiple of world_size\(2\)"),
    (dict(strategy="zero3", steps=0), r"steps=0: need an integer >= 1"),
])
def test_bad_run_raises_on_every_rank(world, kwargs, message):
    with pytest.raises(WorkerError, match=message) as e:
        world(2).run(_bad_run, kwargs)
    assert "ranks [0, 1] raised" in str(e.value)
