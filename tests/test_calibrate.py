"""The default slowdown of an emulated cluster comes from this machine's measured costs
(`ddnb.runtime.calibrate`, `ddnb.runtime.machine`, `placement.default_slowdown`), and a bench
run that overran at its default slowdown is repeated higher before it reports (#28 item 4)."""
import json
import sys

import pytest

from ddnb.bench.args import run_without_overruns
from ddnb.emulate import get_profile
from ddnb.runtime import machine
from ddnb.runtime.placement import CALIBRATION_MARGIN, default_slowdown, needed_slowdown

FAST = {"flops": 1e11, "bandwidth": 1e10, "op_seconds": 3e-6, "message_seconds": 1e-4, "wake_late": 1e-4}


def test_needed_slowdown_is_the_largest_real_to_emulated_ratio_times_workers_per_core():
    ib = get_profile("ib")
    # compute 19.5e12 x 0.4 / 1e11 = 78; memory 1.555e12 / 1e10 = 155.5; messages 1e-4 / 3e-6 = 33.3
    assert needed_slowdown(ib, FAST, workers=8, cores=2) == pytest.approx(CALIBRATION_MARGIN * 155.5 * 4)
    slow_messages = dict(FAST, message_seconds=3e-3)                 # 1000 x the smallest alpha
    assert needed_slowdown(ib, slow_messages, workers=2, cores=2) == pytest.approx(CALIBRATION_MARGIN * 1000)


def test_default_slowdown_is_the_profiles_floor_or_what_the_machine_needs_rounded_up():
    ib = get_profile("ib")
    assert default_slowdown(ib, 8, costs=FAST, cores=2) == 500 * 4          # 933 needed < the floor 2000
    slow = dict(FAST, flops=1e9)                                             # 7800 x 4 x 1.5 = 46,800
    assert default_slowdown(ib, 8, costs=slow, cores=2) == 50_000
    assert default_slowdown(ib, 1, costs=slow, cores=2) == 15_000            # 11,700 rounded up to 1.5 x 10^4
    quiet_slow = dict(FAST, message_seconds=1.46e-3)                         # 487 x 8 x 1.5 = 5,840
    assert default_slowdown(ib, 16, costs=quiet_slow, cores=2) == 6_000      # not 10,000
    assert default_slowdown(get_profile("10gbe"), 4, costs={}, cores=2) == 40   # no costs: the floor


def test_a_cache_from_another_boot_or_a_broken_one_is_not_read(tmp_path, monkeypatch):
    monkeypatch.setenv("DDNB_CACHE", str(tmp_path))
    assert machine.read_costs() is None
    machine.write_costs(dict(FAST, key=machine.cache_key()))
    assert machine.read_costs()["flops"] == 1e11
    machine.write_costs(dict(FAST, key="another host/another boot"))
    assert machine.read_costs() is None
    (tmp_path / "calibration.json").write_text("{not json")
    assert machine.read_costs() is None
    machine.write_costs(dict(FAST, key=machine.cache_key(), flops=0))
    assert machine.read_costs() is None


def test_the_calibration_program_measures_this_machine_once(tmp_path, monkeypatch):
    monkeypatch.setenv("DDNB_CACHE", str(tmp_path))
    costs = machine.machine_costs()
    assert costs is not None and costs["key"] == machine.cache_key()
    assert costs["flops"] > 1e8 and costs["bandwidth"] > 1e8
    # a message of the emulated layer between two processes costs more than a small op in one
    assert costs["message_seconds"] > costs["op_seconds"] > 0
    stored = json.loads((tmp_path / "calibration.json").read_text())
    assert machine.machine_costs() == stored                              # read, not measured again


def _bench(outputs, seen, args):
    def run():
        seen.append(args.slowdown)
        args.default_slowdown = 40.0
        print(outputs[len(seen) - 1])
        return 0
    return run


def test_a_bench_run_that_overran_runs_again_higher_and_prints_only_the_last(capsys):
    args = type("Args", (), {"emulate": "10gbe", "slowdown": None})()
    seen = []
    rc = run_without_overruns(args, _bench(["emulated '10gbe': 3 overruns in 10 syncs on rank(s) 1",
                                            "emulated '10gbe': no overruns in 10 syncs"], seen, args))
    out, err = capsys.readouterr()
    assert rc == 0 and seen == [None, 80.0]
    assert "3 overruns at the default slowdown 40x" in err and "running again at 80x" in err
    assert out.strip() == "emulated '10gbe': no overruns in 10 syncs"


def test_a_chosen_slowdown_or_real_mode_runs_once(capsys):
    for emulate, slowdown in ((None, None), ("10gbe", 7.0)):
        args = type("Args", (), {"emulate": emulate, "slowdown": slowdown})()
        seen = []
        run_without_overruns(args, _bench(["1 overruns in 2 syncs"] * 3, seen, args))
        assert seen == [slowdown]
    assert "running again" not in capsys.readouterr().err
