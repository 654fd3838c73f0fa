"""python -m ddnb.bench dp: argument errors before any process starts, the models, and
tiny real runs (2 workers, 2 steps, narrow models) of every strategy, DDP's columns and
the command's JSON."""
import json

import pytest

from ddnb.bench.__main__ import main
from ddnb.bench.dp import MODELS, add_ddp_columns, bench_model, dp_rows, dp_table
from conftest import requires_horovod

KEYS = {"model", "strategy", "workers", "batch", "step_time", "steps", "param_bytes", "overlap", "comm_time"}
TINY = dict(batch=4, steps=2, warmup=1, rounds=2, width=16, layers=3)


@pytest.mark.parametrize("argv, message", [
    (["dp", "--workers", "1"], "need an integer >= 2 workers"),
    (["dp", "--bucket-mb", "0"], "need a number > 0"),
    (["dp", "--bucket-mb", "-3"], "need a number > 0"),
    (["dp", "--strategies", "naive,zero"], "unknown ['zero']; known: naive, bucketed, ddp, horovod"),
    (["dp", "--models", "huge"], "unknown ['huge']; known: many_small, few_large"),
    (["dp", "--allreduce", "butterfly"], "--allreduce 'butterfly' is not one of torch, naive, tree, ring"),
])
def test_argument_errors_before_any_process(argv, message, capsys, monkeypatch):
    monkeypatch.setattr("ddnb.testing.World", None)  # starting a world would raise TypeError
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_models_have_the_advertised_shapes():
    small, large = bench_model("many_small"), bench_model("few_large")
    assert sum(1 for _ in small.parameters()) == 80 and sum(1 for _ in large.parameters()) == 6
    assert sum(p.numel() for p in large.parameters()) == 3 * (2048 * 2048 + 2048)
    assert MODELS == {"many_small": (128, 40), "few_large": (2048, 3)}
    flops = [sum(2 * m.in_features * m.out_features for m in model if hasattr(m, "in_features"))
             for model in (small, large)]
    assert flops == [1_310_720, 25_165_824]          # the docstring's 1.3 and 25.2 MFLOP forward per sample
    assert round(flops[1] / flops[0], 1) == 19.2
    with pytest.raises(ValueError, match="model 'medium' is not one of"):
        bench_model("medium")


def test_dp_rows_tiny_run(world):
    rows = add_ddp_columns(dp_rows(world(2), ["many_small", "few_large"], ["naive", "bucketed", "ddp"], **TINY))
    assert [(r["model"], r["strategy"]) for r in rows] == [(m, s) for m in ("many_small", "few_large")
                                                           for s in ("naive", "bucketed", "ddp")]
    for r in rows:
        assert KEYS | {"ddp_step_time", "ratio_vs_ddp"} <= set(r)
        assert r["workers"] == 2 and r["step_time"] > 0 and r["steps"] == 2
        ddp = next(d for d in rows if d["model"] == r["model"] and d["strategy"] == "ddp")
        assert r["ddp_step_time"] == ddp["step_time"] and r["ratio_vs_ddp"] == pytest.approx(r["step_time"] /
                                                                                             ddp["step_time"])
        assert (r["overlap"] is None) == (r["strategy"] != "bucketed")
        if r["strategy"] == "bucketed":
            assert 0 <= r["overlap"] <= 1 and r["comm_time"] > 0
    assert "vs ddp" in dp_table(rows)
    json.dumps(rows)


def test_dp_rows_with_a_from_scratch_allreduce(world):
    rows = dp_rows(world(2), ["many_small"], ["bucketed"], allreduce="ring", bucket_mb=0.001, **TINY)
    assert rows[0]["strategy"] == "bucketed" and rows[0]["step_time"] > 0


@requires_horovod
def test_dp_rows_horovod(world):
    rows = add_ddp_columns(dp_rows(world(2, horovod=True), ["many_small"], ["horovod"], **TINY))
    assert rows[0]["strategy"] == "horovod" and rows[0]["step_time"] > 0 and rows[0]["ddp_step_time"] is None


def test_command_prints_json_rows(capsys):
    assert main(["dp", "--workers", "2", "--models", "many_small", "--strategies", "bucketed,ddp",
                       "--steps", "2", "--warmup", "1", "--rounds", "1", "--batch", "4", "--json"]) == 0
    out = capsys.readouterr()
    rows = json.loads(out.out)
    assert [r["strategy"] for r in rows] == ["bucketed", "ddp"] and "data-parallel training step" in out.err
    assert all(r["ddp_step_time"] == rows[1]["step_time"] for r in rows)
