"""Notebook 08's harness (`ddnb.pipeline_parallel.naive_training`) and PartitionExplorer:
every partition, on 2 to 4 of a world's 4 ranks, trains exactly as the unsplit model in
one process; the widget re-runs on the world and its picture draws from plain data."""
import math

import matplotlib

matplotlib.use("Agg")

import pytest
import torch

from ddnb.models import GPTConfig
from ddnb.pipeline_parallel.naive_training import (all_partitions, grads_match, median_step, step_summary,
                                                   train_single, train_split)
from ddnb.viz.partition import plot_partition
from ddnb.viz.widgets.partition_explorer import PartitionExplorer, measure_partition
from test_collective_explorer import WorldAsCluster

CFG = GPTConfig(n_layers=2)          # Embedding, 2 Blocks, Head: 4 layers


@pytest.mark.parametrize("bounds", [[(0, 3), (3, 4)], [(0, 1), (1, 2), (2, 4)], [(0, 1), (1, 2), (2, 3), (3, 4)]])
def test_any_partition_trains_as_one_process(world, bounds):
    split = world(4).run(train_split, CFG, "equal", 4, trace_last=2, bounds=bounds)
    single = train_single(CFG, 4)
    assert split[len(bounds):] == [None] * (4 - len(bounds))       # ranks outside the stages took no part
    assert [r["bounds"] for r in split[:len(bounds)]] == [[tuple(b) for b in bounds]] * len(bounds)
    assert grads_match(split, single)
    assert max(abs(a - b) for a, b in zip(split[len(bounds) - 1]["losses"], single["losses"])) < 1e-4
    assert all(loss is None for r in split[:len(bounds) - 1] for loss in r["losses"])
    params = sum(r["memory"]["parameters"] for r in split[:len(bounds)])
    assert params == single["memory"]["parameters"]                 # the stages hold the model, once


def test_a_wrong_gradient_is_caught():
    single = train_single(CFG, 1)
    wrong = {"grads": [g.clone() for g in single["grads"]]}
    wrong["grads"][3] += 1e-3
    assert grads_match([{"grads": single["grads"]}], single) and not grads_match([wrong], single)
    assert not grads_match([{"grads": single["grads"][:-1]}], single)


def test_all_partitions():
    for layers, p in ((6, 2), (6, 3), (6, 4), (4, 4), (5, 1)):
        parts = all_partitions(layers, p)
        assert len(parts) == math.comb(layers - 1, p - 1) == len({tuple(b) for b in parts})
        assert all(b[0][0] == 0 and b[-1][1] == layers and all(x[1] == y[0] and x[0] < x[1] for x, y in zip(b, b[1:]))
                   for b in parts)
    with pytest.raises(ValueError, match="stages"):
        all_partitions(3, 4)


def test_median_step_and_summary():
    ev = lambda r, k, s, e: {"rank": r, "kind": k, "start": s, "end": e}
    traces = [[[ev(0, "compute", 0, d), ev(1, "compute", d, 2 * d)]] for d in (1.0, 3.0, 2.0)]
    results = [{"traces": [t[0] for t in traces]}, None]
    step = median_step(results)
    assert step == traces[2][0]
    s = step_summary(step, 2)
    assert s["step"] == 4.0 and s["compute"] == [2.0, 2.0] and s["idle"] == [0.5, 0.5]


def test_explorer_reruns_on_the_world_and_draws(world):
    cluster = WorldAsCluster(world(4))
    explorer = PartitionExplorer(cluster, CFG, stages=2, steps=3)
    first = tuple(all_partitions(4, 2)[0])
    assert explorer.results[first]["grads_equal"] is True and explorer.image.value[:4] == b"\x89PNG"
    explorer.stages.value = 3                          # new options, the first one runs
    assert set(explorer.results) == {first, tuple(all_partitions(4, 3)[0])}
    r = explorer.results[tuple(all_partitions(4, 3)[0])]
    assert r["grads_equal"] and len(r["compute"]) == len(r["idle"]) == len(r["memory"]) == 3
    assert all(0 <= i < 1 for i in r["idle"]) and "gradients equal to one process: True" in explorer.status.value
    fig = plot_partition(r, explorer.reference["memory"], cores=2)
    assert "2 cores" in fig.axes[0].get_title() and len(fig.axes[1].get_xticklabels()) == 4


def test_bad_partition_named_before_any_rank_runs(world):
    cluster = WorldAsCluster(world(4))
    with pytest.raises(ValueError, match=r"stage 1 .* is empty"):
        measure_partition(cluster, CFG, [(0, 2), (2, 2), (2, 4)])
    with pytest.raises(ValueError) as e:
        measure_partition(cluster, CFG, [(0, 4)] * 5, steps=0)
    assert "steps=0" in str(e.value) and "1 to 4 stages" in str(e.value)
    with pytest.raises(ValueError, match="stages=5"):
        PartitionExplorer(cluster, CFG, stages=5)
    assert torch.is_tensor(train_single(CFG, 1)["grads"][0])
