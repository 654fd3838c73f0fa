"""HorovodKnobs (notebook 07): the knob runs count Horovod's fused all-reduces from its
timeline (one per tensor with fusion off, fewer with the default threshold), the engines
are restarted exactly when the settings change, and the picture draws from plain dicts."""
import matplotlib

matplotlib.use("Agg")

import pytest

from conftest import requires_horovod
from ddnb.bench.horovod_knobs import _start_with, measure_knobs
from ddnb.data_parallel.horovod_knobs import fused_allreduces, knob_env, knob_steps
from ddnb.testing import World
from ddnb.viz.horovod_knobs import knob_label, plot_knob_runs
from ddnb.viz.widgets.horovod_knobs import HorovodKnobs

LAYERS = 2                       # an MLP of 3 Linear layers: 6 gradient tensors


def ev(start, end, activity="GLOO_ALLREDUCE"):
    return {"start": start, "end": end, "activity": activity}


def test_fused_allreduces_groups_overlapping_spans():
    events = [ev(0.0, 1.0), ev(0.1, 1.0), ev(0.2, 1.1), ev(0.05, 0.3, "NEGOTIATE_ALLREDUCE"),   # one buffer of 3
              ev(1.2, 1.5),                                                                   # one alone
              ev(2.0, 2.5), ev(2.0001, 2.5)]                                                  # one of 2
    assert fused_allreduces(events) == [3, 1, 2]
    assert fused_allreduces([ev(0, 1), ev(1, 2), ev(2, 3)]) == [1, 1, 1]    # back to back: not fused


def test_knob_env_and_bad_knobs_named():
    assert knob_env(0, 5) == {"HOROVOD_FUSION_THRESHOLD": "0", "HOROVOD_CYCLE_TIME": "5"}
    assert knob_env(1 / 16) == {"HOROVOD_FUSION_THRESHOLD": "65536"} and knob_env() == {}
    with pytest.raises(ValueError) as e:
        knob_env(-1, 0)
    assert "fusion_mb=-1" in str(e.value) and "cycle_ms=0" in str(e.value)
    assert knob_label({"fusion_mb": 1 / 16, "cycle_ms": None, "fp16": True}) == "fusion 64 KB, cycle default, fp16"


class FakeCluster:
    """Records what _start_with asks of a cluster; start_horovod refuses changed settings
    in the same processes, as ddnb.runtime.horovod.check_settings does."""

    def __init__(self, env=None):
        self.horovod, self._horovod_env, self.ran, self.calls = env is not None, env or {}, env, []

    def stop_horovod(self):
        self.calls.append("stop")
        self.horovod = False

    def start_horovod(self, env):
        if self.ran is not None and self.ran != env:
            raise ValueError("start_horovod(env=...): Horovod already ran in these engines with other settings")
        self.calls.append("start")
        self.horovod, self._horovod_env, self.ran = True, env, env

    def restart(self):
        self.calls.append("restart")
        self.ran = None


def test_engines_restart_exactly_when_the_settings_change():
    c = FakeCluster({})
    assert _start_with(c, {}) is False and c.calls == []                       # the running Horovod is reused
    assert _start_with(c, knob_env(0)) is True and c.calls == ["stop", "restart", "start"]
    assert _start_with(c, knob_env(0)) is False and c.calls == ["stop", "restart", "start"]
    fresh = FakeCluster(None)
    assert _start_with(fresh, knob_env(0)) is False and fresh.calls == ["stop", "start"]


@requires_horovod
def test_fusion_off_is_one_allreduce_per_tensor(monkeypatch, tmp_path):
    monkeypatch.setenv("HOROVOD_FUSION_THRESHOLD", "0")     # the spawned ranks inherit it before hvd.init()
    with World(2, timeout=60, horovod=True) as w:
        out = w.run(knob_steps, str(tmp_path / "off.json"), 2, 2, layers=LAYERS)
    assert out[0]["tensors"] == 6 and out[0]["fused"] == [1] * 12 and out[1]["fused"] == []
    assert all(o["step_time"] > 0 for o in out)


@requires_horovod
def test_widget_measures_defaults_and_fp16_on_a_horovod_world(world, tmp_path):
    w = world(2, horovod=True)

    class WorldAsCluster(FakeCluster):
        n, emulate = 2, None

        def run(self, fn, *args, **kwargs):
            return w.run(fn, *args, layers=LAYERS, **kwargs)

    cluster = WorldAsCluster({})
    knobs = HorovodKnobs(cluster, steps=2, traced=2)
    default = knobs.runs[0]
    assert sum(default["fused"]) == 12 and 1 <= default["allreduces_per_step"] <= 6 and default["restart_s"] == 0
    knobs.fp16.value = True                                  # fp16 alone: no restart, the same Horovod
    assert cluster.calls == [] and knobs.runs[1]["fp16"] and sum(knobs.runs[1]["fused"]) == 12
    assert "fused all-reduces per step" in knobs.status.value and knobs.image.value[:4] == b"\x89PNG"
    fig = plot_knob_runs(knobs.runs + [dict(default, fusion_mb=0, allreduces_per_step=6.0)], cores=2)
    assert "2 cores" in fig.axes[0].get_xlabel() and len(fig.axes[0].get_yticklabels()) == 3
    with pytest.raises(ValueError, match="steps=0"):
        measure_knobs(cluster, steps=0)
