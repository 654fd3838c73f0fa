"""The server's link saturating (ddnb.parameter_server.saturation, its harness in
ddnb.bench.parameter_server): the fixed-peer BSP server (one or two shards) and the ring
train exactly as one process on the concatenated batches; in an emulated cluster the
server's step grows with the workers as the model says, two shards shorten it and the
ring beats it; bad arguments are named."""
from functools import partial

import pytest
import torch

from conftest import bsp_reference
from ddnb.bench.parameter_server import charged_compute, server_vs_ring
from ddnb.data import digits
from ddnb.models import mlp
from ddnb.parameter_server.saturation import model_step_time, train_fixed_peers

MODEL = partial(mlp, (64, 16, 10), seed=0)


def _single_process(workers, steps, batch_size, lr, momentum=0.0, seed=0):
    return bsp_reference(MODEL, workers, steps, batch_size, lr, momentum, seed)


def _run(workers, servers, strategy, steps=3):
    train_set, _ = digits(seed=0)
    return train_fixed_peers(MODEL, train_set, workers, servers, strategy, steps, batch_size=16, lr=0.1)


@pytest.mark.parametrize("servers, strategy", [(1, "server"), (2, "server"), (1, "ring")])
def test_it_trains_as_one_process_on_the_concatenated_batches(world, servers, strategy):
    out = world(5).run(_run, 3, servers, strategy)
    expected = _single_process(3, 3, 16, 0.1)
    if strategy == "server":
        assert [r["role"] for r in out] == ["server"] * servers + ["worker"] * 3 + ["idle"] * (2 - servers)
        got = torch.cat([r["params"] for r in out if r["role"] == "server"])   # the shards, in order
        assert torch.allclose(got, expected, atol=1e-6, rtol=0)
    else:
        assert [r["role"] for r in out] == ["idle", "worker", "worker", "worker", "idle"]
        for r in out[1:4]:
            assert torch.allclose(r["params"], expected, atol=1e-6, rtol=0)
    assert all(len(r["losses"]) == 3 for r in out if r["role"] == "worker")


def test_emulated_the_server_link_saturates_and_shards_share_it():
    """A slow link (1 ms, 1 MB/s: a 4.3 KB message takes 5.3 ms) next to which the compute
    is small: the server's step follows (N - 1 + 2k)(alpha + S/(k B)) + compute, in
    emulated time, from real messages (an overrun of the real compute adds little)."""
    from ddnb.emulate import custom

    train_set, _ = digits(seed=0)
    profile = custom(alpha=1e-3, bandwidth=1e6, peak_flops=1e11, efficiency=1.0, memory_bandwidth=1e12, slowdown=20)
    got = server_vs_ring(profile, MODEL, train_set, workers=(1, 4), servers=(1, 2), steps=3, batch_size=16,
                         timeout=120)
    step = {(r["strategy"], r["servers"], r["workers"]): r for r in got["rows"]}
    assert got["same_params"]
    assert step["server", 1, 4]["step_time"] > 2 * step["server", 1, 1]["step_time"]   # 7 tau against 3 tau
    assert step["server", 2, 4]["step_time"] < step["server", 1, 4]["step_time"]       # two shards share it
    assert step["ring", 0, 4]["step_time"] < step["server", 1, 4]["step_time"]
    for key in [("server", 1, 1), ("server", 1, 4), ("server", 2, 4)]:
        assert abs(step[key]["error"]) < 0.1, (key, step[key])


def test_model_step_time_by_hand():
    # k = 1: (N + 1) tau + c + U_1; k = 2: (N + 3) tau_2 + c + U_2; ring: 2(N - 1)(alpha + S/(N B)) + c + U
    assert model_step_time("server", 4, 1, 1000, 1e-3, 1e6, 0.5, 0.2) == pytest.approx(5 * 2e-3 + 0.7)
    assert model_step_time("server", 4, 2, 1000, 1e-3, 1e6, 0.5, 0.1) == pytest.approx(7 * 1.5e-3 + 0.6)
    assert model_step_time("ring", 4, 1, 1000, 1e-3, 1e6, 0.5, 0.2) == pytest.approx(6 * 1.25e-3 + 0.7)
    assert model_step_time("ring", 1, 1, 1000, 1e-3, 1e6, 0.5, 0.2) == pytest.approx(0.7)


def test_the_model_charges_what_each_role_runs():
    """c, U_k and U from the operations run here on the profile's device: a server's update
    grows with the gradients it averages and shrinks with its shard, a ring worker's with
    its additions; each is positive and the compute is at least forward + backward."""
    from ddnb.cost.dp_step import compute_times
    from ddnb.emulate import get_profile

    train_set, _ = digits(seed=0)
    got = charged_compute("10gbe", MODEL, train_set, batch_size=16)
    x, y = train_set.x[:16], train_set.y[:16]
    ct = compute_times(MODEL(), x, y, torch.nn.functional.cross_entropy, get_profile("10gbe"))
    assert got["compute"] >= ct.forward + ct.backward > 0
    assert got["server_update"](8, 1) > got["server_update"](2, 1) > got["server_update"](2, 2) > 0
    assert got["ring_update"](8) > got["ring_update"](2) > got["ring_update"](1) > 0


def test_bad_arguments_are_named_together(world):
    with pytest.raises(ValueError) as e:
        model_step_time("gossip", 0, 0, 0, -1.0, 0.0, 0.0, 0.0)
    assert all(k in str(e.value) for k in ("strategy", "workers", "servers", "param_bytes", "alpha", "bandwidth"))
    with pytest.raises(Exception, match=r"servers=2 \+ workers=3 need 5 ranks; the world has 2"):
        world(2).run(_run, 3, 2, "server")


@pytest.mark.parametrize("argv, message", [
    (["ps", "--workers", "0"], "--workers"),
    (["ps", "--steps", "1"], "need an integer >= 2"),
    (["ps", "--emulate", "dialup"], "invalid choice: 'dialup'"),
    (["ps", "--slowdown", "10"], "--slowdown needs --emulate"),
])
def test_bench_argument_errors_before_any_process(argv, message, capsys, monkeypatch):
    from ddnb.bench.__main__ import main

    monkeypatch.setattr("ddnb.testing.World", None)  # starting a world would raise TypeError
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_bench_prints_json_rows_real_and_emulated(capsys):
    import json

    from ddnb.bench.__main__ import main

    assert main(["ps", "--workers", "1,2", "--servers", "1", "--width", "16", "--steps", "2", "--json"]) == 0
    out = capsys.readouterr()
    rows = json.loads(out.out)
    assert [(r["strategy"], r["servers"], r["workers"]) for r in rows] == [("server", 1, 1), ("ring", 0, 1),
                                                                           ("server", 1, 2), ("ring", 0, 2)]
    assert "model_step_time" not in rows[0] and "real mode" in out.err and "same parameters: True" in out.err
    assert main(["ps", "--workers", "2", "--servers", "1", "--width", "16", "--steps", "2", "--emulate", "10gbe",
                 "--slowdown", "200", "--json"]) == 0
    out = capsys.readouterr()
    rows = json.loads(out.out)
    assert all(r["model_step_time"] > 0 for r in rows) and "emulated '10gbe'" in out.err
