"""ddnb.pipeline_parallel.naive: a GPT split across 2 and 4 ranks has the gradients of the unsplit
model; partitions; validation before any message; bytes per step as the cost model says."""
import pytest
import torch

from ddnb.cost.model_parallel import boundary_bytes, model_parallel_bytes, sequential_idle_fractions
from ddnb.runtime.errors import WorkerError
from ddnb.pipeline_parallel.naive import (balanced_partition, bytes_by_name, check_bounds, idle_fractions, imbalance,
                                 measure_layer_times, partition_layers, stage_params, stage_totals)
from ddnb.models import GPTConfig, gpt, lm_loss, mlp, synthetic_task

CFG = GPTConfig(n_layers=2)     # Embedding, Block, Block, Head: 4 layers
BATCH = 4


def reference_grads(cfg, seed, steps=1, lr=0.0):
    """The unsplit model on one process: loss and gradients (after `steps` SGD steps)."""
    model = gpt(cfg, seed=seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for idx, targets in synthetic_task(cfg, batch_size=BATCH, steps=steps, seed=seed):
        opt.zero_grad()
        loss = lm_loss(model(idx), targets)
        loss.backward()
        opt.step() if lr else None
    return loss.item(), [p.grad.clone() for p in model.parameters()]


def split_step(cfg, seed, strategy, steps=1, lr=0.0):
    """Runs on every rank: this stage's loss (last rank), grads, bounds and traced events."""
    import torch.distributed as dist

    from ddnb.pipeline_parallel.naive import NaiveModelParallel, partition_layers
    from ddnb.models import gpt, lm_loss, synthetic_task
    from ddnb.trace import Tracer

    model = gpt(cfg, seed=seed)
    times = [3.0, 1.0, 1.0, 3.0] if strategy == "time" else None
    bounds = partition_layers(model, dist.get_world_size(), strategy, times=times)
    tracer = Tracer(rank=dist.get_rank())
    stage = NaiveModelParallel(model, bounds, tracer=tracer)
    opt = torch.optim.SGD(stage.parameters(), lr=lr)
    for idx, targets in synthetic_task(cfg, batch_size=BATCH, steps=steps, seed=seed):
        opt.zero_grad()
        tracer.clear()
        loss = stage.forward_backward(idx, targets, lm_loss)
        opt.step() if lr else None
    return loss, [p.grad for p in stage.parameters()], bounds, tracer.take()


@pytest.mark.parametrize("n,strategy", [(2, "equal"), (4, "equal"), (4, "params"), (3, "time")])
def test_gradients_equal_the_unsplit_model(world, n, strategy):
    ref_loss, ref_grads = reference_grads(CFG, seed=1)
    results = world(n).run(split_step, CFG, 1, strategy)
    losses = [r[0] for r in results]
    assert losses[:-1] == [None] * (n - 1)
    assert losses[-1] == pytest.approx(ref_loss, abs=1e-6)
    grads = [g for r in results for g in r[1]]                      # stage order is parameter order
    assert len(grads) == len(ref_grads)
    for g, ref in zip(grads, ref_grads):
        assert torch.allclose(g, ref, atol=1e-5, rtol=0)
    assert results[0][2] == partition_layers(gpt(CFG), n, strategy,
                                      times=[3.0, 1.0, 1.0, 3.0] if strategy == "time" else None)


def test_training_steps_match_the_unsplit_model(world):
    ref_loss, ref_grads = reference_grads(CFG, seed=2, steps=3, lr=0.1)
    results = world(4).run(split_step, CFG, 2, "equal", 3, 0.1)
    assert results[-1][0] == pytest.approx(ref_loss, abs=1e-5)
    for g, ref in zip([g for r in results for g in r[1]], ref_grads):
        assert torch.allclose(g, ref, atol=1e-5, rtol=0)


def test_bytes_per_step_equal_the_activation_size(world):
    n = 4
    results = world(n).run(split_step, CFG, 0, "equal")
    events = [e for r in results for e in r[3]]
    act = boundary_bytes(BATCH, CFG.seq_len, CFG.d_model)           # (B, T, d) float32
    assert act == BATCH * CFG.seq_len * CFG.d_model * 4
    sent = bytes_by_name(events, n)
    expect = model_parallel_bytes(n, act)
    assert sent["activation"] == [act, act, act, 0]                 # forward: r -> r + 1
    assert sent["gradient"] == [0, act, act, act]                   # backward: r -> r - 1
    assert [a + g for a, g in zip(sent["activation"], sent["gradient"])] == expect["per_rank"]
    assert sum(sent["activation"]) + sum(sent["gradient"]) == expect["total"] == 6 * act
    assert sent["shape"] == [64, 64, 64, 0]                         # the 8-int64 header before each activation
    # every rank computed; the others waited: idle fractions are in (0, 1)
    idle = idle_fractions(events, n)
    assert all(0 < f < 1 for f in idle)
    assert {e["name"] for e in events if e["kind"] == "compute"} == {"forward", "backward"}


def bad_stage(cfg, bounds):
    from ddnb.pipeline_parallel.naive import NaiveModelParallel
    from ddnb.models import gpt

    NaiveModelParallel(gpt(cfg), bounds)


def test_more_stages_than_layers_fails_before_any_message(world):
    w = world(4)
    tiny = GPTConfig(n_layers=1)                                    # 3 layers for 4 ranks
    with pytest.raises(WorkerError, match=r"world_size\(4\) > layers\(3\)"):
        w.run(bad_stage, tiny, [(0, 1), (1, 2), (2, 3), (3, 3)], timeout=30)
    with pytest.raises(WorkerError, match=r"2 stages in bounds for world_size\(4\)"):
        w.run(bad_stage, CFG, [(0, 2), (2, 4)], timeout=30)
    assert not w.broken                                             # no rank was left blocked
    with pytest.raises(ValueError, match=r"stages\(4\) > layers\(3\): every stage needs at least one layer"):
        partition_layers(gpt(tiny), 4)


def test_partition_equal():
    layers = list(mlp((4, 4, 4, 4, 4, 4), seed=0))                  # 9 layers (Linear, ReLU, ...)
    assert partition_layers(layers, 1) == [(0, 9)]
    assert partition_layers(layers, 4) == [(0, 3), (3, 5), (5, 7), (7, 9)]
    assert partition_layers(layers, 9) == [(i, i + 1) for i in range(9)]


def test_partition_params_balances_the_gpt():
    model = gpt(GPTConfig(), seed=0)                                # Embedding, 4 Blocks, Head
    counts = stage_params(model, [(i, i + 1) for i in range(6)])
    assert counts == [1024, 12704, 12704, 12704, 12704, 576]
    equal = partition_layers(model, 4)
    assert equal == [(0, 2), (2, 4), (4, 5), (5, 6)]                # two Blocks on rank 1, the Head alone
    params = partition_layers(model, 4, "params")
    assert params == [(0, 2), (2, 3), (3, 4), (4, 6)]
    assert stage_params(model, params) == [13728, 12704, 12704, 13280]
    assert imbalance(stage_params(model, params)) < imbalance(stage_params(model, equal))


def test_partition_time_follows_the_times():
    layers = list(mlp((4, 4, 4), seed=0))                           # Linear, ReLU, Linear
    assert partition_layers(layers, 2, "time", times=[5.0, 1.0, 1.0]) == [(0, 1), (1, 3)]
    assert partition_layers(layers, 2, "time", times=[1.0, 1.0, 5.0]) == [(0, 2), (2, 3)]
    assert stage_totals([1.0, 1.0, 5.0], [(0, 2), (2, 3)]) == [2.0, 5.0]


def test_balanced_partition_is_optimal():
    import itertools

    weights = [3, 1, 4, 1, 5, 9, 2, 6]
    for p in range(1, 6):
        best = min(max(sum(weights[a:b]) for a, b in zip((0,) + cut, cut + (8,)))
                   for cut in itertools.combinations(range(1, 8), p - 1))
        got = balanced_partition(weights, p)
        assert check_bounds(got, 8, p) == got
        assert max(stage_totals(weights, got)) == best


def test_measure_layer_times_leaves_no_grads():
    model = gpt(CFG, seed=0)
    idx, _ = synthetic_task(CFG, batch_size=2, steps=1)[0]
    times = measure_layer_times(model, idx, repeats=2)
    assert len(times) == 4 and all(t > 0 for t in times)
    assert all(p.grad is None for p in model.parameters())
    assert partition_layers(model, 2, "time", times=times) in ([(0, 1), (1, 4)], [(0, 2), (2, 4)], [(0, 3), (3, 4)])


def test_partition_errors_say_what_is_wrong():
    layers = list(mlp((4, 4, 4), seed=0))
    with pytest.raises(ValueError, match=r"strategy='fast' is not one of \('equal', 'params', 'time'\)"):
        partition_layers(layers, 2, "fast")
    with pytest.raises(ValueError, match="stages=0: need an integer >= 1"):
        partition_layers(layers, 0)
    with pytest.raises(ValueError, match="strategy='time' needs times"):
        partition_layers(layers, 2, "time")
    with pytest.raises(ValueError, match="times has 2 entries for 3 layers"):
        partition_layers(layers, 2, "time", times=[1, 2])
    with pytest.raises(ValueError, match=r"times\[1\]=-1: need a number >= 0"):
        partition_layers(layers, 2, "time", times=[1, -1, 2])
    with pytest.raises(ValueError, match="times is only used by strategy='time'"):
        partition_layers(layers, 2, "params", times=[1, 1, 1])
    with pytest.raises(ValueError, match=r"^partition_layers: strategy='fast' is not one of .*; stages=0: need an "
                                         r"integer >= 1; times is only used by strategy='time'"):
        partition_layers(layers, 0, "fast", times=[1, 1, 1])
    with pytest.raises(ValueError, match=r"strategy='params' needs the layers themselves, not a count \(-3\); "
                                         r"layers=-3: need an integer >= 1"):
        partition_layers(-3, 2, "params")
    with pytest.raises(ValueError, match=r"stage 1 ends at 2 but stage 2 starts at 1"):
        check_bounds([(0, 1), (1, 2), (1, 3)], 3, 3)
    with pytest.raises(ValueError, match=r"the last stage ends at 2, not layers\(3\); stage 1 \(2, 2\) is empty"):
        check_bounds([(0, 2), (2, 2)], 3, 2)


def test_cost_model():
    assert boundary_bytes(2, 3, 5) == 120
    assert model_parallel_bytes(1, 100) == {"forward": 0, "backward": 0, "total": 0, "per_rank": [0]}
    assert sequential_idle_fractions([1, 1, 1, 1]) == [0.75] * 4
    assert sequential_idle_fractions([1, 3]) == [0.75, 0.25]        # mean (p-1)/p = 0.5 whatever the split
    with pytest.raises(ValueError, match="d_model=0"):
        boundary_bytes(2, 3, 0)
    with pytest.raises(ValueError):
        sequential_idle_fractions([])
