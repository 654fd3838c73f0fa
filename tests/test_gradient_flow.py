"""ddnb.data_parallel.grad_flow (gradient flow recorded live on real ranks), its plot
(ddnb.viz.gradient_flow) and its widget (ddnb.viz.widgets.gradient_flow): every layer on
every rank, buckets that cover the layers once, all-reduces that start after their
gradients exist, and averaged gradients equal across ranks and to one process on the
global batch."""
import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from conftest import requires_horovod  # noqa: E402
from ddnb.data_parallel.grad_flow import (flow_invariants, gradient_flow, record_gradient_flow,  # noqa: E402
                                          reference_gradient_flow)
from ddnb.viz.gradient_flow import plot_gradient_flow  # noqa: E402
from ddnb.viz.widgets.gradient_flow import GradientFlowWidget  # noqa: E402

STEPS, LAYERS = 3, 10


def check_records(data, workers, layers=LAYERS, steps=STEPS):
    """What every strategy must give; returns the records."""
    ref = reference_gradient_flow(workers, steps=steps, layers=layers)
    assert [r["rank"] for r in data] == list(range(workers))
    for r in data:
        assert r["workers"] == workers and len(r["layers"]) == layers >= 10 and len(r["steps"]) == steps
        for t, s in enumerate(r["steps"]):
            assert len(s["local"]) == len(s["time"]) == len(s["averaged"]) == layers
            assert all(v > 0 for v in s["local"]) and all(0 <= x <= s["backward_end"] for x in s["time"])
            owned = sorted(i for b in s["buckets"] for i in b["layers"])
            assert owned == list(range(layers)), f"rank {r['rank']} step {t}: buckets hold layers {owned}"
            assert all(s["bucket"][i] == b["id"] for b in s["buckets"] for i in b["layers"])
            for b in s["buckets"]:   # the overlap rule: nothing is sent before it is computed
                assert b["start"] >= max(s["time"][i] for i in b["layers"]), (r["rank"], t, b)
                assert b["start"] <= b["end"] <= s["sync_end"] + 1e-3
            assert s["averaged"] == pytest.approx(data[0]["steps"][t]["averaged"], abs=1e-6)
            assert s["averaged"] == pytest.approx(ref[t], rel=1e-4, abs=1e-6)
    # the local gradients differ between ranks (each its own digits); only the average agrees
    assert any(abs(a - b) > 1e-6 for a, b in zip(data[0]["steps"][0]["local"], data[1]["steps"][0]["local"]))
    assert flow_invariants(data, ref) == {"buckets_cover_layers": True, "overlap_rule": True, "ranks_agree": True,
                                          "equal_reference": True}
    return data


@pytest.mark.parametrize("strategy", ["naive", "bucketed", "ddp"])
def test_every_layer_every_rank_buckets_and_averages(world, strategy):
    data = check_records(gradient_flow(world(2), strategy, steps=STEPS, layers=LAYERS), 2)
    buckets = [len(s["buckets"]) for s in data[0]["steps"]]
    if strategy == "naive":         # one all-reduce per layer, all of them after backward
        assert buckets == [LAYERS] * STEPS
        assert all(b["start"] >= s["backward_end"] for s in data[0]["steps"] for b in s["buckets"])
    elif strategy == "bucketed":    # 0.03 MB buckets: fewer than layers, more than one
        assert all(1 < k < LAYERS for k in buckets), buckets
    else:                           # DDP: step 0 in one bucket (it does not know the gradients' order
        assert buckets[0] == 1      # yet), then rebuilt in the order they arrived, 0.03 MB each
        assert all(1 < k < LAYERS for k in buckets[1:]), buckets


def test_a_subset_of_ranks_trains_and_the_others_wait(world):
    w = world(3)
    data = check_records(gradient_flow(w, "bucketed", workers=2, steps=STEPS), 2)
    assert len(data) == 2
    assert w.run(record_gradient_flow, "ddp", steps=1, workers=2)[2:] == [None]


@pytest.mark.parametrize("strategy", ["bucketed", "ddp"])
def test_the_bucket_size_sets_the_buckets(world, strategy):
    w = world(2)
    tiny = gradient_flow(w, strategy, steps=2, bucket_mb=0.001)[0]["steps"][1]["buckets"]   # DDP: rebuilt
    huge = gradient_flow(w, strategy, steps=2, bucket_mb=1.0)[0]["steps"][1]["buckets"]
    assert [b["layers"] for b in tiny] == [[i] for i in reversed(range(LAYERS))]   # each layer its own, last first
    assert [sorted(b["layers"]) for b in huge] == [list(range(LAYERS))]


@requires_horovod
@pytest.mark.horovod
def test_horovod_grouped_allreduces(world):
    w = world(2, horovod=True)
    data = check_records(gradient_flow(w, "horovod", steps=STEPS), 2)
    assert all(1 < len(s["buckets"]) < LAYERS for s in data[0]["steps"])
    flow = GradientFlowWidget(w, strategy="horovod", steps=1, step=0)     # offered: this world runs Horovod
    assert flow.data[0]["strategy"] == "horovod" and flow.workers.disabled and flow.note.value == ""


def test_bad_arguments_named_before_any_rank_runs(world):
    w = world(2)
    with pytest.raises(ValueError) as e:
        gradient_flow(w, "ring", workers=5, steps=0, layers=1, bucket_mb=-1)
    msg = str(e.value)
    for name in ("strategy='ring'", "workers=5", "steps=0", "layers=1", "bucket_mb=-1"):
        assert name in msg, msg
    with pytest.raises(ValueError, match="horovod=True"):
        gradient_flow(w, "horovod")                 # this world runs no Horovod
    assert w.run(lambda: 1) == [1, 1]               # and nothing blocked


def synthetic(start_b0=0.002):
    step = {"step": 0, "local": [1e-3, 2e-3], "time": [0.002, 0.001], "bucket": [1, 0], "averaged": [1.5e-3] * 2,
            "buckets": [{"id": 0, "layers": [1], "start": start_b0, "end": 0.003},
                        {"id": 1, "layers": [0], "start": 0.002, "end": 0.004}],
            "backward_end": 0.002, "sync_end": 0.004}
    return [{"strategy": "bucketed", "rank": r, "workers": 2, "bucket_mb": 0.01, "layers": ["layer 0", "layer 1"],
             "steps": [step]} for r in range(2)]


def test_flow_invariants_catch_a_bucket_sent_before_its_gradient_and_a_wrong_average():
    assert flow_invariants(synthetic())["overlap_rule"] is True
    assert flow_invariants(synthetic(start_b0=0.0005))["overlap_rule"] is False   # layer 1 produced at 0.001
    assert flow_invariants(synthetic(), [[1.5e-3, 1.5e-3]])["equal_reference"] is True
    assert flow_invariants(synthetic(), [[1.5e-3, 1.5001e-3]])["equal_reference"] is False   # relative 7e-5 off


def test_plot_headless_and_bad_step_named(world):
    fig = plot_gradient_flow(synthetic(), 0)
    assert len(fig.axes) == 2 * 2 + 1                       # per rank: timeline, averaged; one colour bar
    with pytest.raises(ValueError, match="step=3"):
        plot_gradient_flow(synthetic(), 3)
    with pytest.raises(ValueError, match="non-empty list"):
        plot_gradient_flow([], 0)


def test_widget_reruns_on_the_cluster(world):
    w = world(3)
    flow = GradientFlowWidget(w, steps=2, step=1)
    assert len(flow.data) == 3 and flow.image.value[:4] == b"\x89PNG"
    assert "horovod" not in [v for _, v in flow.strategy.options] and "Horovod is not initialised" in flow.note.value
    first = flow.data
    flow.workers.value = 2                                   # a new live run on 2 ranks, not a replay
    assert len(flow.data) == 2 and flow.data is not first
    flow.strategy.value = "naive"
    assert flow.data[0]["strategy"] == "naive" and len(flow.data[0]["steps"][1]["buckets"]) == LAYERS
    flow.step.value = 0                                      # only redraws
    assert flow.data[0]["strategy"] == "naive" and flow.image.value[:4] == b"\x89PNG"


@pytest.mark.parametrize("strategy", ["naive", "bucketed", "ddp"])
def test_train_dp_equals_one_process_on_the_global_batch(world, strategy):
    import torch

    from ddnb.data_parallel.demo import train_dp
    from ddnb.data_parallel.train import reference_digits

    out = world(2).run(train_dp, strategy, steps=4)
    ref = reference_digits(workers=2, steps=4)["params"]
    assert torch.equal(out[0][0], out[1][0]) and (out[0][0] - ref).abs().max().item() < 1e-5
    names = out[0][3]
    if strategy == "bucketed":    # the norms behind the heatmap: one per parameter, averaged ones equal on ranks
        assert len(out[0][2]) == 4 and len(out[0][2][0]["before"]) == len(names) == 4
        assert out[0][2][0]["after"] == pytest.approx(out[1][2][0]["after"], abs=1e-7)
    if strategy == "naive":       # one all-reduce per parameter per step, in the trace
        assert sum(e["kind"] == "collective" for e in out[0][1]) == 4 * 4


def test_train_dp_bad_input_named_on_every_rank(world):
    from ddnb.runtime.errors import WorkerError
    from ddnb.data_parallel.demo import train_dp

    w = world(2)
    with pytest.raises(WorkerError, match="strategy='horovod'.*steps=0"):
        w.run(train_dp, "horovod", steps=0)
    with pytest.raises(WorkerError, match="more than one epoch"):
        w.run(train_dp, "naive", steps=100)
    assert w.run(lambda: 2) == [2, 2]
