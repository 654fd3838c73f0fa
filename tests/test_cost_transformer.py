"""ddnb.cost.transformer: parameter counts against published configurations and against
the real ddnb GPT, FLOP formulas (ddnb.flops) and the training-time estimator by hand, validation;
ddnb.cost.published: the stated compute against 6·N·D."""
import math

import pytest

from ddnb.cost import flops_per_token, model_flops_utilization, training_days, training_flops, transformer_params
from ddnb.cost.published import GPT3_FAMILY, MODELS, gpt3_family_table, model_table
from ddnb.cost.transformer import block_params
from ddnb.flops import matmul_flops, matmul_params
from ddnb.models import GPTConfig, gpt


def test_gpt3_configuration_gives_175_billion():
    # Brown et al. 2020, Table 2.1: 96 layers, d_model 12288, vocabulary 50257, context 2048
    n = transformer_params(96, 12288, 50257, 2048)
    assert n == pytest.approx(175e9, rel=0.01)
    # by hand: 96 (12 d^2 + 13 d) + (V + T) d + 2 d
    d = 12288
    assert n == 96 * (12 * d * d + 13 * d) + (50257 + 2048) * d + 2 * d


def test_small_case_by_hand():
    # L=2, d=4, V=10, T=3, r=4, tied: per block 12*16 + 13*4 = 244; embeddings 13*4 = 52; final LN 8
    assert block_params(4) == 244
    assert transformer_params(2, 4, 10, 3) == 2 * 244 + 52 + 8 == 548
    assert transformer_params(2, 4, 10, 3, tied_embeddings=False) == 548 + 40     # + output projection V d
    # r=2: (4 + 4) d^2 + (9 + 2) d = 128 + 44
    assert block_params(4, mlp_ratio=2) == 172


@pytest.mark.parametrize("kw", [{}, dict(vocab_size=64, seq_len=32, d_model=64, n_layers=2),
                                dict(d_model=48, n_heads=3, mlp_ratio=2, n_layers=3)])
def test_counts_the_real_ddnb_gpt(kw):
    cfg = GPTConfig(**kw)
    real = sum(p.numel() for p in gpt(cfg).parameters())
    assert transformer_params(cfg.n_layers, cfg.d_model, cfg.vocab_size, cfg.seq_len, cfg.mlp_ratio,
                              tied_embeddings=False) == real


def test_gpt3_family_within_2_percent_of_stated():
    rows = gpt3_family_table()
    assert [r["name"] for r in rows] == [m["name"] for m in GPT3_FAMILY]
    for r in rows:
        assert r["counted"] == pytest.approx(r["params"], rel=0.02), r["name"]


def test_six_n_d_by_hand_and_against_stated_compute():
    assert training_flops(175e9, 300e9) == pytest.approx(3.15e23)
    assert training_flops(2, 3) == 36.0
    rows = {r["name"]: r for r in model_table()}
    assert [r["year"] for r in model_table()] == sorted(m["year"] for m in MODELS)
    stated = [r for r in rows.values() if r["flops"] is not None]
    assert {r["name"] for r in stated} == {"GPT-3", "Chinchilla", "Llama 3 405B"}
    for r in stated:                                  # the papers' figures are 6·N·D within 3%
        assert r["ratio"] == pytest.approx(1.0, abs=0.03), r["name"]
    assert rows["AlexNet"]["flops_6nd"] is None       # not a transformer: 6·N·D does not apply
    assert all(m["source"] for m in MODELS)


def test_flops_per_token_by_hand():
    # L=2, d=4, V=10, T=3: matmul weights 2 * 12 * 16 + 10 * 4 = 424; 6 * 424 + 12 * 2 * 3 * 4 = 2832
    assert matmul_params(2, 4, 10) == 424
    assert flops_per_token(2, 4, 10, 3) == 2832
    assert matmul_flops(2, 3, 4) == 48
    # for GPT-3 the attention term is small: 6N dominates
    per_token = flops_per_token(96, 12288, 50257, 2048)
    assert per_token == pytest.approx(6 * 175e9, rel=0.03)


def test_mfu_and_training_days_by_hand():
    assert model_flops_utilization(100.0, 1e9, 1e12) == pytest.approx(0.1)
    # 86400e12 FLOPs at 1e12 FLOP/s, MFU 1: one day; two devices at efficiency 0.5: still one day
    assert training_days(86400e12, 1e12, mfu=1.0) == pytest.approx(1.0)
    assert training_days(86400e12, 1e12, n_devices=2, mfu=1.0, scaling_efficiency=0.5) == pytest.approx(1.0)
    assert training_days(86400e12, 1e12, n_devices=4, mfu=0.5) == pytest.approx(0.5)
    gpt3 = training_days(3.14e23, 312e12, mfu=0.4)
    assert 28_000 < gpt3 < 30_000
    assert training_days(3.14e23, 312e12, n_devices=1024, mfu=0.4, scaling_efficiency=0.9) == \
        pytest.approx(gpt3 / (1024 * 0.9))


@pytest.mark.parametrize("call, names", [
    (lambda: transformer_params(0, 768, 50257, 1024), ["n_layers=0"]),
    (lambda: transformer_params(12, -1, 50257, 1024), ["d_model=-1"]),
    (lambda: transformer_params(12, 768, 50257, 1.5), ["seq_len=1.5"]),
    (lambda: transformer_params(True, 768, 0, 1024), ["n_layers=True", "vocab_size=0"]),
    (lambda: training_flops(-1, 300e9), ["num_params=-1"]),
    (lambda: training_flops(1e9, math.inf), ["num_tokens=inf"]),
    (lambda: flops_per_token(2, 4, 0, 3), ["vocab_size=0"]),
    (lambda: model_flops_utilization(0, 1e9, 1e12), ["tokens_per_second=0"]),
    (lambda: training_days(1e23, 312e12, n_devices=0), ["n_devices=0"]),
    (lambda: training_days(1e23, 312e12, mfu=1.5), ["mfu=1.5"]),
    (lambda: training_days(1e23, 312e12, scaling_efficiency=0), ["scaling_efficiency=0"]),
    (lambda: training_days(0, 312e12), ["total_flops=0"]),
    (lambda: training_days(1e23, -1, n_devices=0, mfu=0, scaling_efficiency=2),
     ["peak_flops=-1", "n_devices=0", "mfu=0", "scaling_efficiency=2"]),
])
def test_bad_input_names_every_bad_value(call, names):
    with pytest.raises(ValueError) as err:
        call()
    for name in names:
        assert name in str(err.value)
