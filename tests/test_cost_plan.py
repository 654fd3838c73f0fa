"""ddnb.cost.layout, ddnb.cost.planner and ddnb.cost.megatron2021: a layout's memory equals
chapter 11's formulas worked by hand, its step time the sum of chapter 12's parts, the
planner drops what cannot run or fit with a reason and ranks the rest the same way every
time, and the model predicts Megatron-LM's Table 1 within 25%. Formulas only: no process."""
import json
import math
import re

import pytest

import ddnb
from ddnb.cost.alpha_beta import allreduce_time
from ddnb.cost.layout import (Layout, layer_bytes, layout_flops, layout_memory, layout_problems, layout_step_time,
                              model_shape)
from ddnb.cost.megatron2021 import SELENE, TABLE_1, megatron2021_rows
from ddnb.cost.planner import best, factorizations, layouts, plan, plan_table
from ddnb.cost.transformer import transformer_params
from ddnb.emulate.profile import Link, Profile

SHAPE = dict(n_layers=8, d_model=1024, n_heads=16, vocab=32000, seq_len=1024)
SBH = 1024 * 1 * 1024                       # s·b·h of one micro-batch of one sequence
BLOCK = 12 * 1024 ** 2 + 13 * 1024          # one block's parameters (Kaplan et al. 2020, Table 1)
FLAT = Profile("flat", peak_flops=100e12, efficiency=0.5, memory_bandwidth=1e12, intra=Link(1e-6, 100e9),
               inter=Link(1e-5, 10e9), ranks_per_host=4, slowdown=1.0)


def test_model_shape_takes_a_gptconfig_or_a_dict():
    from ddnb.models import GPTConfig

    cfg = GPTConfig(vocab_size=50, seq_len=32, d_model=64, n_heads=4, n_layers=2)
    assert model_shape(cfg) == model_shape(dict(n_layers=2, d_model=64, n_heads=4, vocab=50, seq_len=32))


def test_tensor_parallel_layer_is_korthikanti_eq2():
    """sbh(10 + 24/t + 5as/(ht)) bytes in 16-bit with dropout (Korthikanti et al. 2022, Eq. 2)."""
    s, b, h, a = 1024, 1, 1024, 16
    for t in (1, 2, 4, 8):
        eq2 = s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
        assert layer_bytes(model_shape(SHAPE), Layout(tp=t)) == pytest.approx(eq2)


def test_layout_memory_equals_the_chapter_11_formulas_by_hand():
    # dp 4 x pp 2 x tp 2, ZeRO-1, micro-batches of 1 sequence, B = 16: m = 4; the first stage holds more
    mem = layout_memory(SHAPE, Layout(dp=4, pp=2, tp=2, zero=1), global_batch=16)
    psi = (4 * BLOCK + (32000 + 1024) * 1024) / 2                  # 4 blocks + embeddings, / tp
    per_layer = 62 * SBH                                            # sbh(10 + 24/2 + 5·16·1024/(1024·2))
    assert mem["stage"] == "first"
    assert mem["parameters"] == 2 * psi and mem["gradients"] == 2 * psi and mem["optimizer"] == 12 * psi / 4
    assert mem["activations"] == 2 * 4 * per_layer                 # 1F1B: min(p - 0, m) = 2 micro-batches in flight
    assert mem["gathered"] == 0 and mem["total"] == pytest.approx((4 + 3) * psi + 8 * per_layer)
    # checkpointed: each layer keeps its input 2·sbh, plus one layer rebuilt in backward; now the last
    # stage holds more: one micro-batch in flight, but the head's logits (fp32, vocabulary / tp)
    ck = layout_memory(SHAPE, Layout(dp=4, pp=2, tp=2, zero=1, checkpointing=True), global_batch=16)
    psi_last = (4 * BLOCK + 2 * 1024 + 32000 * 1024) / 2
    head = 2 * 2 * SBH + 4 * 1024 * 16000 + SBH                     # Korthikanti Sec. 4.2: LN, logits, mask
    assert ck["stage"] == "last" and ck["parameters"] == 2 * psi_last
    assert ck["activations"] == 1 * 4 * 2 * SBH + per_layer + head
    # ZeRO-3 on dp 8 (pp 1): every state / 8, plus two gathered blocks; one stage holds the whole model
    z3 = layout_memory(SHAPE, Layout(dp=8, zero=3), global_batch=16)
    psi1 = transformer_params(8, 1024, 32000, 1024)
    assert z3["parameters"] + z3["gradients"] + z3["optimizer"] == pytest.approx(16 * psi1 / 8)
    assert z3["gathered"] == 2 * BLOCK * 2
    head = 2 * 2 * SBH + 4 * 1024 * 32000 + SBH                     # Korthikanti Sec. 4.2: LN and logits
    assert z3["activations"] == 8 * (34 * SBH + 5 * 16 * 1024 ** 2) + head


def test_step_time_is_the_sum_of_its_parts_by_hand():
    lay = Layout(dp=2, pp=2, tp=2, microbatch_size=1)
    t = layout_step_time(SHAPE, lay, FLAT, global_batch=8)           # m = 4
    m, act = 4, SBH * 2
    layer = 6 * 12 * 1024 ** 2 + 12 * 1024 * 1024                  # one block, fwd + bwd, per token
    flops = 1024 * (4 * layer + 6 * 32000 * 1024) / 2               # last stage: 4 layers + logits, / tp
    compute = flops / (100e12 * 0.5)
    tp = 4 * 4 * allreduce_time("ring", act, 2, 1e-6, 1 / 100e9)    # 4 all-reduces a layer, 4 layers
    assert t["compute"] == pytest.approx(m * compute) and t["tp_comm"] == pytest.approx(m * tp)
    assert t["bubble"] == pytest.approx((2 - 1) * (compute + tp))   # (p - 1) stage-times (v = 1)
    slots = m + 2 - 1                                                # the schedule's m + p - 1 slots
    assert t["pp_comm"] == pytest.approx(2 * slots * (1e-5 + act / 2 / 10e9 + 1e-6 + act / 2 / 100e9))
    psi = (4 * BLOCK + (32000 + 1024) * 1024) / 2
    assert t["dp_comm"] == pytest.approx(allreduce_time("ring", 2 * psi, 2, 1e-6, 1 / 100e9))  # dp pair on one host
    parts = ("compute", "bubble", "tp_comm", "cp_comm", "pp_comm", "dp_comm")
    assert t["step_time"] == pytest.approx(sum(t[k] for k in parts))
    # interleaving divides the bubble by v, checkpointing adds a forward and 2 all-reduces a layer
    v2 = layout_step_time(SHAPE, Layout(dp=2, pp=2, tp=2, chunks=2), FLAT, global_batch=8)
    assert v2["bubble"] == pytest.approx(t["bubble"] / 2)
    ck = layout_step_time(SHAPE, Layout(dp=2, pp=2, tp=2, checkpointing=True), FLAT, global_batch=8)
    assert ck["tp_comm"] == pytest.approx(t["tp_comm"] * 6 / 4) and ck["compute"] > t["compute"]


def test_zero_runs_each_units_collectives_as_often_as_ddnbs_zero():
    """Per unit (8 blocks + embedding + head), a reduce-scatter or an all-gather is one ring
    phase: (N-1) alpha + (N-1)/N · unit bytes / B. Stage 1: one of each a step; stage 2: a
    reduce-scatter every micro-batch; stage 3: also two all-gathers every micro-batch."""
    from ddnb.cost.layout import stage_params, zero_collectives, zero_units

    n, m, units = 4, 4, zero_units(model_shape(SHAPE), 1)
    assert units == 10
    psi = stage_params(model_shape(SHAPE), 1)
    phase = (n - 1) * 1e-6 + (n - 1) / n * 2 * psi / units / 100e9        # 2-byte units, intra ring
    z0 = layout_step_time(SHAPE, Layout(dp=n, zero=0), FLAT, global_batch=16)
    assert z0["dp_comm"] == pytest.approx(allreduce_time("ring", 2 * psi, n, 1e-6, 1 / 100e9))
    for stage, collectives in ((1, 2 * units), (2, (m + 1) * units), (3, 3 * m * units)):
        count = zero_collectives(stage, units, m)
        assert count["reduce_scatter"] + count["all_gather"] == collectives
        z = layout_step_time(SHAPE, Layout(dp=n, zero=stage), FLAT, global_batch=16)
        assert z["dp_comm"] == pytest.approx(collectives * phase)
    # the same bytes as one all-reduce for stage 1 (chapter 11: ZeRO-1 costs no extra traffic),
    # 2(N-1)·units latencies instead of 2(N-1)
    z1 = layout_step_time(SHAPE, Layout(dp=n, zero=1), FLAT, global_batch=16)["dp_comm"]
    assert z1 - z0["dp_comm"] == pytest.approx(2 * (n - 1) * (units - 1) * 1e-6)


def test_the_textbook_count_is_one_allreduce_a_step():
    """The planner's first version, kept to show its refutation: ZeRO 1-2 cost one all-reduce,
    ZeRO-3 1.5x that at every micro-batch; fewer latencies than per-unit collectives."""
    from ddnb.cost.layout import textbook_dp_comm

    z0 = layout_step_time(SHAPE, Layout(dp=4, zero=0), FLAT, global_batch=16)["dp_comm"]
    for zero, factor in ((0, 1), (1, 1), (2, 1), (3, 1.5 * 4)):
        lay = Layout(dp=4, zero=zero)
        assert textbook_dp_comm(SHAPE, lay, FLAT, 16) == pytest.approx(z0 * factor)
        if zero:
            assert textbook_dp_comm(SHAPE, lay, FLAT, 16) < layout_step_time(SHAPE, lay, FLAT, 16)["dp_comm"]


def test_allreduce_across_hosts_hierarchical_or_one_flat_ring():
    """dp 8 on two hosts of 4: NCCL's two levels, or ddnb's flat ring, whose 2(N-1) steps each
    wait for the inter link."""
    from ddnb.cost.layout import stage_params
    from ddnb.cost.scaling import hierarchical_allreduce_time

    psi = stage_params(model_shape(SHAPE), 1)
    lay = Layout(dp=8)
    hier = layout_step_time(SHAPE, lay, FLAT, global_batch=16)["dp_comm"]
    ring = layout_step_time(SHAPE, lay, FLAT, global_batch=16, allreduce="ring")["dp_comm"]
    assert hier == pytest.approx(hierarchical_allreduce_time(2 * psi, 8, 4, FLAT.intra, FLAT.inter))
    assert ring == pytest.approx(allreduce_time("ring", 2 * psi, 8, 1e-5, 1 / 10e9))
    assert ring > hier
    with pytest.raises(ValueError, match="allreduce='tree'"):
        layout_step_time(SHAPE, lay, FLAT, global_batch=16, allreduce="tree")
    with pytest.raises(ValueError, match="allreduce='tree'"):
        plan(SHAPE, FLAT, 8, 80e9, 16, allreduce="tree")


def test_layout_flops_is_megatron_eq3():
    for _, heads, h, l, *_ in TABLE_1:
        shape = dict(n_layers=l, d_model=h, n_heads=heads, vocab=51200, seq_len=2048)
        eq3 = 96 * 512 * 2048 * l * h * h * (1 + 2048 / (6 * h) + 51200 / (16 * l * h))
        assert layout_flops(shape, 512, checkpointing=True) == pytest.approx(eq3, rel=1e-12)


def test_layout_problems_name_each_rule():
    shape = model_shape(dict(n_layers=30, d_model=768, n_heads=12, vocab=1000, seq_len=1000))
    assert layout_problems(shape, Layout(tp=16), 64, 8) == ["tp 16 > 8 ranks per host",
                                                          "heads 12 % tp 16 != 0"]
    assert layout_problems(shape, Layout(tp=8), 64, 8) == ["heads 12 % tp 8 != 0"]
    assert layout_problems(shape, Layout(pp=4, cp=3, dp=3), 64, 8) == [
        "layers 30 % pp 4 != 0", "seq 1000 % cp 3 != 0", "batch 64 % (dp 3 x microbatch size 1) != 0"]
    assert layout_problems(shape, Layout(tp=3), 64, 8)[0].startswith("tp 3 does not divide 8 ranks per host")
    assert "DeepSpeed" in layout_problems(shape, Layout(pp=2, dp=2, zero=2), 64, 8)[0]
    assert layout_problems(shape, Layout(dp=2, pp=3, tp=4), 64, 8) == []


def test_factorizations_and_layouts():
    assert factorizations(4, 2) == [(1, 4), (2, 2), (4, 1)]
    twelve = factorizations(12)                                      # 10 ways for 2², times 4 for 3
    assert all(math.prod(f) == 12 for f in twelve) and len(set(twelve)) == len(twelve) == 40
    assert len(layouts(8)) == 20 * 4 * 2 * 4                        # C(3+3, 3) grids of 2^3, zero, ckpt, b


def test_plan_drops_what_cannot_fit_with_its_reason_and_every_drop_has_one():
    rows = plan(SHAPE, FLAT, workers=8, memory_per_worker=2e9, global_batch=16)
    assert len(rows) == len(layouts(8))
    assert all((r["reason"] is None) == r["fits"] for r in rows)
    assert all(r["memory"] <= 2e9 for r in rows if r["fits"])
    big = [r for r in rows if r["reason"] and r["reason"].startswith("memory")]
    assert big and all(r["memory"] > 2e9 for r in big)
    for r in big:                                                    # "memory 2.02 GB > 2 GB", never "2 GB > 2 GB"
        shown = re.fullmatch(r"memory (\S+) GB > 2 GB", r["reason"]).group(1)
        assert float(shown) == pytest.approx(r["memory"] / 1e9, rel=5e-3) and float(shown) > 2
    assert any("shards nothing" in (r["reason"] or "") for r in rows)       # zero 1-3 with dp = 1: the same as zero 0
    assert any(r["reason"] and "ranks per host" in r["reason"] for r in rows)   # tp 8 > 4
    order = [r["fits"] for r in rows]
    assert order == sorted(order, reverse=True)                      # fits first
    times = [r["step_time"] for r in rows if r["fits"]]
    assert times == sorted(times)
    assert "dropped:" in plan_table(rows, top=3)
    nothing = plan(SHAPE, FLAT, workers=2, memory_per_worker=1e6, global_batch=4)
    assert best(nothing) is None and all(r["reason"] for r in nothing)


def test_plan_ranking_is_deterministic():
    a = plan(SHAPE, FLAT, workers=8, memory_per_worker=8e9, global_batch=16)
    b = plan(dict(SHAPE), FLAT, workers=8, memory_per_worker=8e9, global_batch=16)
    assert a == b and [r["layout"] for r in a] == [r["layout"] for r in b]


def test_a_larger_model_moves_the_best_layout_toward_model_parallelism():
    kw = dict(workers=64, memory_per_worker=80e9, global_batch=512, microbatch_sizes=(1, 2))
    small = best(plan(dict(n_layers=24, d_model=2048, n_heads=16, vocab=51200, seq_len=2048), SELENE, **kw))
    large = best(plan(dict(n_layers=48, d_model=8192, n_heads=64, vocab=51200, seq_len=2048), SELENE, **kw))
    assert small["dp"] == 64 and small["tp"] * small["pp"] * small["cp"] == 1
    assert large["tp"] * large["pp"] * large["cp"] > 1 and large["dp"] < small["dp"]


def test_bad_arguments_raise_one_error_naming_each():
    with pytest.raises(ValueError) as e:
        plan(dict(n_layers=0, d_model=64, n_heads=4, vocab=10), "nope", workers=0, memory_per_worker=-1,
             global_batch=1.5, precision="fp8", zero_stages=(4,), checkpointing=(), microbatch_sizes=[0],
             dropout="yes")
    msg = str(e.value)
    for part in ("missing seq_len", "profile='nope'", "workers=0", "memory_per_worker=-1", "global_batch=1.5",
                 "precision='fp8'", "zero_stages=(4,)", "checkpointing=()", "microbatch_sizes=[0]", "dropout='yes'"):
        assert part in msg, part
    with pytest.raises(ValueError, match=r"heads 16 % tp 3 != 0"):
        layout_step_time(SHAPE, Layout(tp=3), FLAT, 8)
    with pytest.raises(ValueError, match=r"global_batch=0.*precision='fp4'"):
        layout_memory(SHAPE, Layout(), 0, precision="fp4")


def test_megatron2021_every_row_within_25_percent_and_fits_80_gb():
    rows = megatron2021_rows()
    assert [r["paper_tflops"] for r in rows] == [137, 138, 142, 135, 138, 140, 148, 155, 163, 163]
    assert all(r["tensor"] * r["pipeline"] * r["data"] == r["gpus"] for r in rows)
    assert all(abs(r["error"]) <= 0.25 for r in rows), [(r["model"], r["error"]) for r in rows]
    assert all(r["memory"] <= 80e9 for r in rows)
    for params, heads, h, l, *_ in TABLE_1:                          # Eq. (2): the billions as printed
        assert transformer_params(l, h, 51200, 2048) / 1e9 == pytest.approx(params, abs=0.06)


def test_cli_plan_paper_json_and_argument_errors(capsys):
    from ddnb.bench.__main__ import main

    assert main(["plan", "--paper", "megatron2021", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["model"] for r in rows][::9] == ["1.7B", "1008.0B"] and set(rows[0]) >= {
        "model", "tensor", "pipeline", "data", "gpus", "paper_tflops", "predicted_tflops", "error"}
    with pytest.raises(SystemExit):
        main(["plan", "--workers", "8"])
    assert "plan needs --model, --memory, --batch" in capsys.readouterr().err
    assert main(["plan", "--model", "8,1024,16,32000,1024", "--workers", "4", "--memory", "8GB", "--batch", "8",
                 "--top", "2"]) == 0
    assert "dropped:" in capsys.readouterr().out


def test_plan_is_exported_at_package_level():
    assert ddnb.plan is plan
