"""ddnb.bench: size parsing, argument errors before any process starts, and a tiny real
run of the all-reduce benchmark (2 workers, 2 sizes, torch and ring)."""
import json

import pytest

import ddnb.collectives  # noqa: F401  the all-reduces benchmarked: a broken package fails here, not skips
from ddnb.bench import allreduce as bench
from ddnb.bench.__main__ import main
from ddnb.bench.allreduce import allreduce_rows, busbw_factor, parse_size, parse_sizes, p2p_rows
from conftest import requires_horovod


@pytest.mark.parametrize("text, size", [("4KB", 4096), ("4kb", 4096), ("64MB", 64 << 20), ("1GB", 1 << 30),
                                        ("8", 8), ("16B", 16), ("2MiB", 2 << 20), ("1K", 1024)])
def test_parse_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text, match", [("4XB", "cannot parse size '4XB'"), ("", "cannot parse"),
                                         ("1.5MB", "cannot parse"), ("6", "multiple of 4"), ("0KB", "positive")])
def test_parse_size_errors(text, match):
    with pytest.raises(ValueError, match=match):
        parse_size(text)


def test_parse_sizes_range_and_list():
    assert parse_sizes("4KB..64KB") == [4096, 8192, 16384, 32768, 65536]
    assert parse_sizes("4KB..64KB", factor=4) == [4096, 16384, 65536]
    assert parse_sizes("4KB..100KB", factor=4) == [4096, 16384, 65536]  # stops below the upper end
    assert parse_sizes("1MB..1MB") == [1 << 20]
    assert parse_sizes("4KB,1MB,16MB") == [4096, 1 << 20, 16 << 20]
    assert parse_sizes("64KB") == [65536]
    assert len(parse_sizes("4KB..64MB")) == 15
    with pytest.raises(ValueError, match=r"need low <= high.*low=65536, high=4096"):
        parse_sizes("64KB..4KB")


@pytest.mark.parametrize("argv, message", [
    (["allreduce", "--workers", "1"], "need an integer >= 2 workers"),
    (["allreduce", "--workers", "two"], "need an integer >= 2 workers"),
    (["allreduce", "--sizes", "4KB..3XB"], "cannot parse size '3XB'"),
    (["allreduce", "--algorithms", "ring,butterfly"], "unknown algorithms ['butterfly']; known: naive, tree, ring"),
    (["allreduce", "--seconds", "0"], "need a number > 0"),
    ([], "required: BENCHMARK"),
])
def test_argument_errors_before_any_process(argv, message, capsys, monkeypatch):
    monkeypatch.setattr("ddnb.testing.World", None)  # starting a world would raise TypeError
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_console_entry_point_dispatches_to_bench(capsys):
    from ddnb.__main__ import main

    assert main([]) == 0 and "bench" in capsys.readouterr().out
    assert main(["nope"]) == 2 and "unknown command 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "allreduce", "--workers", "0"])
    assert "usage: ddnb bench allreduce" in capsys.readouterr().err


def check_rows(rows, sizes, algorithms, workers):
    assert [(r["size"], r["algorithm"]) for r in rows] == [(s, a) for s in sizes for a in algorithms]
    for r in rows:
        assert {"size", "algorithm", "time", "algbw", "busbw", "workers", "ratio_vs_torch"} <= set(r)
        assert r["workers"] == workers and r["time"] > 0 and r["iters"] >= 1
        assert r["algbw"] == pytest.approx(r["size"] / r["time"] / 1e9)
        assert r["busbw"] == pytest.approx(r["algbw"] * 2 * (workers - 1) / workers)
        torch_row = next(t for t in rows if t["size"] == r["size"] and t["algorithm"] == "torch")
        assert r["ratio_vs_torch"] == pytest.approx(r["busbw"] / torch_row["busbw"])
    json.dumps(rows)  # plain data


def test_allreduce_rows_tiny_run(world):
    sizes, algorithms = [4096, 65536], ["torch", "ring"]
    rows = allreduce_rows(world(2), sizes, algorithms, target_seconds=0.02)
    check_rows(rows, sizes, algorithms, 2)
    assert busbw_factor(2) == 1.0 and busbw_factor(4) == 1.5


@pytest.mark.parametrize("pattern", ["pingpong", "sendrecv"])
def test_p2p_rows(world, pattern):
    rows = p2p_rows(world(2), [4096, 65536], pattern, target_seconds=0.02)
    assert [(r["pattern"], r["size"]) for r in rows] == [(pattern, 4096), (pattern, 65536)]
    assert all(r["time"] > 0 and r["bw"] == pytest.approx(r["size"] / r["time"] / 1e9) for r in rows)


def test_message_sizes_are_a_ring_chunk_and_the_vector():
    assert bench.message_sizes(64 << 20, 4) == [16 << 20, 64 << 20]
    assert bench.message_sizes(4096, 3) == [1364, 4096]  # 4096 / 3 rounded down to float32
    assert bench.message_sizes(8, 4) == [4, 8]


def test_add_predictions():
    rows = [{"size": 10**6, "workers": 4, "algorithm": a, "time": 1e-3} for a in ("ring", "naive", "torch")]
    bench.add_predictions(rows, {"sendrecv": (1e-5, 1e-9), "pingpong": (0.0, 1e-9)}, 0.0)
    assert rows[0]["predicted_time"] == pytest.approx(1.56e-3)  # ring: the sendrecv link
    assert rows[0]["prediction_error"] == pytest.approx(0.56)
    assert rows[0]["pingpong_prediction_error"] == pytest.approx(0.5)  # 1.5e-3 on the ping-pong link
    assert rows[1]["predicted_time"] == pytest.approx(6e-3)  # naive: 2*3*(1e6 * 1e-9)
    assert "predicted_time" not in rows[2]


def test_main_json_end_to_end(capsys):
    """The command line, as a user runs it (its own 2-process world), --json and --fit."""
    assert main(["allreduce", "--workers", "2", "--sizes", "4KB,16KB", "--algorithms", "ring,torch",
                       "--seconds", "0.01", "--json", "--fit"]) == 0
    out = capsys.readouterr()
    rows = json.loads(out.out)
    check_rows(rows, [4096, 16384], ["ring", "torch"], 2)
    assert all(r["predicted_time"] > 0 for r in rows if r["algorithm"] == "ring")
    assert "busbw ceiling" in out.err and "alpha" in out.err


@requires_horovod
def test_allreduce_rows_horovod(world):
    rows = allreduce_rows(world(2, horovod=True), [4096], ["torch", "horovod"], target_seconds=0.02)
    check_rows(rows, [4096], ["torch", "horovod"], 2)


def test_allreduce_benchmark_with_fit():
    rows, model = bench.allreduce_benchmark(2, [4096, 16384], ["ring", "torch"], target_seconds=0.01,
                                            repeats=1, fit=True, timeout=60)
    check_rows(rows, [4096, 16384], ["ring", "torch"], 2)
    assert model["link"]["size"] == 16384 and all(r["link_bw"] == model["link"]["bw"] for r in rows)
    assert set(model["alpha_beta"]) == {"pingpong", "sendrecv"} and model["gamma"] > 0
    assert [r["size"] for r in model["p2p"]["sendrecv"]] == [2048, 4096, 8192, 16384]
    ring = [r for r in rows if r["algorithm"] == "ring"]
    assert all(r["predicted_time"] > 0 and "pingpong_prediction_error" in r for r in ring)


@requires_horovod
def test_allreduce_benchmark_measures_horovod_in_its_own_world():
    rows, model = bench.allreduce_benchmark(2, [4096], ["horovod", "torch"], target_seconds=0.01, repeats=1)
    check_rows(rows, [4096], ["horovod", "torch"], 2)
