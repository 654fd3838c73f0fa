"""Horovod's Compression.fp16 in `python -m ddnb.bench compress` (ddnb/bench/compress_horovod.py):
bytes handed to Horovod's all-reduce equal the formula (2 bytes per element), training
equals the DDP row's, and without Horovod the rows are skipped with a message."""
import pytest

from conftest import requires_horovod
from ddnb.bench.compress import compress_benchmark, parse_method
from ddnb.bench.compress_horovod import horovod_results

PARAMS = 85_002          # 64-256-256-10


@requires_horovod
@pytest.mark.horovod
def test_horovod_fp16_row_bytes_equal_formula_and_training_equals_ddp():
    rows = compress_benchmark(2, ["none", "horovod:none", "horovod:fp16"], steps=4, timeout=300)
    by = {r["method"]: r for r in rows}
    assert [r["method"] for r in rows] == ["none", "horovod:none", "horovod:fp16"]
    assert by["horovod:none"]["bytes_per_step"] == 4 * PARAMS and by["horovod:fp16"]["bytes_per_step"] == 2 * PARAMS
    assert all(r["bytes_match_formula"] for r in rows) and by["horovod:fp16"]["compression_ratio"] == 2.0
    assert by["horovod:fp16"]["total_bytes"] == 4 * 2 * PARAMS                  # every step, no warm-up
    # hvd.DistributedOptimizer (average) = DDP (average) on the same batches: same model
    assert by["horovod:none"]["final_loss"] == pytest.approx(by["none"]["final_loss"], abs=1e-5)
    assert by["horovod:none"]["final_accuracy"] == by["none"]["final_accuracy"]
    assert by["horovod:fp16"]["final_loss"] == pytest.approx(by["none"]["final_loss"], abs=1e-3)


def test_without_horovod_the_rows_are_skipped_with_a_message(monkeypatch, capsys):
    monkeypatch.setattr("ddnb.runtime.horovod.horovod_available", lambda: False)
    monkeypatch.setattr("ddnb.testing.World", None)                 # no world may start
    assert horovod_results(2, ["horovod:fp16"], 3, 8, 0.05, 0, 60) == []
    assert "horovod:fp16 skipped: Horovod with PyTorch is not importable" in capsys.readouterr().err
    assert parse_method("horovod:fp16") == ("fp16", {})
    with pytest.raises(ValueError, match="or horovod:none or horovod:fp16"):
        parse_method("horovod:gzip")
