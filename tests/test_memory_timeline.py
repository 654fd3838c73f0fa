"""ddnb.memory_timeline on live gloo ranks: for every strategy the bytes held after the
step equal the formula exactly (ZeRO's padding included), the activations saved for
backward are all released by the end of backward, GPipe's activation peak on the first
stage is m micro-batches against 1F1B's p, and the plot and widget build headless."""
import matplotlib
import pytest

matplotlib.use("Agg")

from ddnb.memory_timeline import STRATEGIES, expected_at_rest, memory_timeline, step_timeline  # noqa: E402
from ddnb.models import GPTConfig  # noqa: E402

PARTS = ("parameters", "gradients", "optimizer")


@pytest.fixture(scope="module")
def timelines(world):
    return {s: world(4).run(step_timeline, s) for s in STRATEGIES}


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_bytes_after_the_step_equal_the_formula(timelines, strategy):
    for rank, events in enumerate(timelines[strategy]):
        label, _, last = events[-1]
        assert {k: last[k] for k in PARTS} == expected_at_rest(strategy, GPTConfig(), 4, rank), (strategy, rank, label)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_activations_rise_in_forward_and_return_to_zero(timelines, strategy):
    for events in timelines[strategy]:
        acts = [b["activations"] for _, _, b in events]
        assert acts[0] == 0 and max(acts) > 0 and acts[-1] == 0
        labels = [label for label, _, _ in events]
        assert labels[0] == "start" and labels[-1] in ("optimizer step", "all-gather")


def test_sharding_divides_the_states_by_n(timelines):
    """At rest (the last event): ZeRO-1 optimizer /4, ZeRO-2 also gradients, ZeRO-3 all three,
    against DP's; the default GPT's layers divide by 4, so no padding here."""
    dp = timelines["dp"][0][-1][2]
    ratio = {s: {k: timelines[s][0][-1][2][k] / dp[k] for k in PARTS} for s in ("zero1", "zero2", "zero3")}
    assert ratio["zero1"] == {"parameters": 1, "gradients": 1, "optimizer": 0.25}
    assert ratio["zero2"] == {"parameters": 1, "gradients": 0.25, "optimizer": 0.25}
    assert ratio["zero3"] == {"parameters": 0.25, "gradients": 0.25, "optimizer": 0.25}


@pytest.mark.parametrize("stage, strategy", list(enumerate(["dp", "zero1", "zero2", "zero3"])))
def test_dp_and_zero_equal_the_papers_formula(timelines, stage, strategy):
    """The default GPT's layers divide by N = 4: no padding, so the bytes are the paper's
    (Sec. 5, fp32: 4 + 4 bytes, K = 8) exactly, ddnb.cost.zero_memory_parts."""
    from ddnb.cost import zero_memory_parts
    from ddnb.models import gpt

    psi = sum(p.numel() for p in gpt(GPTConfig()).parameters())
    paper = zero_memory_parts(psi, 4, stage, k=8, param_bytes=4, grad_bytes=4)
    for events in timelines[strategy]:
        assert {k: events[-1][2][k] for k in PARTS} == paper


def test_zero3_gathers_one_layer_at_a_time(timelines):
    """During forward, ZeRO-3 holds its shards plus the gathered layer that runs."""
    from ddnb.models import gpt

    numels = [sum(p.numel() for p in m.parameters()) for m in gpt(GPTConfig())]
    shards = timelines["zero3"][0][0][2]["parameters"]
    forward = [b["parameters"] - shards for label, _, b in timelines["zero3"][0] if label.startswith("F")]
    assert forward == [4 * n for n in numels]


def test_gpipe_holds_m_microbatches_1f1b_at_most_p(timelines):
    m, p = 8, 4
    gpipe = max(b["activations"] for _, _, b in timelines["gpipe"][0])
    one_f = max(b["activations"] for _, _, b in timelines["1f1b"][0])
    assert gpipe > one_f
    assert gpipe * p == one_f * m                     # rank 0: m vs p micro-batches of the same size
    for rank in range(4):
        g = max(b["activations"] for _, _, b in timelines["gpipe"][rank])
        o = max(b["activations"] for _, _, b in timelines["1f1b"][rank])
        assert o < g


def test_dp_and_zero_save_the_same_activations(timelines):
    peaks = {s: max(b["activations"] for _, _, b in timelines[s][0]) for s in ("dp", "zero1", "zero2", "zero3")}
    assert len(set(peaks.values())) == 1, peaks


def test_bad_arguments_named_before_any_message(world):
    class Fake:
        n = 4

        def run(self, *a):                # never reached
            raise AssertionError("ran")

    with pytest.raises(ValueError) as e:
        memory_timeline(Fake(), "zero4", workers=5)
    assert "strategy" in str(e.value) and "workers" in str(e.value)
    with pytest.raises(ValueError, match="n_heads"):
        memory_timeline(Fake(), "tp", workers=3)
    with pytest.raises(ValueError, match="batch_size"):
        memory_timeline(Fake(), "zero1", workers=4, batch_size=6)


def test_subgroup_of_workers(world):
    """workers < world size: a group of the first ranks runs; the others return nothing."""
    class OnWorld:
        n = 4

        def run(self, fn, *args):
            return world(4).run(fn, *args)

    out = memory_timeline(OnWorld(), "zero1", workers=2)
    assert len(out) == 2
    for rank, events in enumerate(out):
        assert {k: events[-1][2][k] for k in PARTS} == expected_at_rest("zero1", GPTConfig(), 2, rank)


def test_plot_and_widget_headless(timelines):
    from ddnb.viz.memory_timeline import peak_parts, plot_memory_timeline
    from ddnb.viz.widgets.memory_timeline import MemoryTimelineWidget

    axes = plot_memory_timeline(timelines["1f1b"], title="1f1b")
    assert len(axes) == 4 and axes[0].get_xticklabels()[0].get_text() == "start"
    assert peak_parts(timelines["dp"][0])["optimizer"] == expected_at_rest("dp", GPTConfig(), 4)["optimizer"]
    with pytest.raises(ValueError, match="unit"):
        plot_memory_timeline(timelines["dp"], unit="parsecs")

    class Replay:                          # a cluster stand-in that answers from the measured runs
        n = 4

        def run(self, fn, strategy, workers, kwargs):
            return timelines[strategy]

    w = MemoryTimelineWidget(Replay(), strategy="zero2")
    assert w.image.value[:4] == b"\x89PNG" and "zero2 on 4 workers" in w.status.value
    w.strategy.value = "gpipe"
    assert w.timelines == timelines["gpipe"]
    w.workers.value = 3                    # tp does not split 4 heads 3 ways: shown, not raised
    w.strategy.value = "tp"
    assert "n_heads" in w.status.value
