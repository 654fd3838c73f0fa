"""ddnb.decentralized on live gloo ranks: every method equals its single-process simulation
(`reference.simulate`) to rounding; the equivalences (complete-graph D-PSGD = all-reduce
SGD = local SGD with H = 1 = single-process SGD with torch's optimizer; one worker = SGD);
the bytes in the trace equal the formulas of `cost.py` exactly; bad input is named before
any message."""
import math
from functools import partial

import pytest
import torch
import torch.nn.functional as F

from ddnb.data import digits
from ddnb.decentralized import (TOPOLOGIES, TRAIN, DecentralizedConfig, check_mixing, exponential, from_matrix,
                                gossip, ring, run_bytes, simulate, spectral_gap, topology, torus)
from ddnb.models import flat_params, mlp
from ddnb.parameter_server import worker_batch
from ddnb.runtime.errors import WorkerError

TRAIN_SET, TEST_SET = digits()
MODEL = partial(mlp, (64, 16, 10))
NUMEL = sum(p.numel() for p in MODEL().parameters())


def params(results):
    return torch.stack([r["params"] for r in results])


# --- topologies ----------------------------------------------------------------------

@pytest.mark.parametrize("name", list(TOPOLOGIES))
@pytest.mark.parametrize("n", [1, 2, 3, 4, 6, 8, 9])
def test_every_topology_is_doubly_stochastic_and_connected(name, n):
    W = topology(name, n).W
    assert torch.allclose(W.sum(0), torch.ones(n, dtype=W.dtype)) and torch.allclose(W.sum(1), torch.ones(n, dtype=W.dtype))
    assert (W >= 0).all()
    assert check_mixing(W) is not None
    assert 0 < spectral_gap(W) <= 1 + 1e-12


def test_spectral_gaps_match_their_closed_forms():
    assert spectral_gap(ring(8).W) == pytest.approx(1 - (1 + 2 * math.cos(2 * math.pi / 8)) / 3, abs=1e-12)
    for n in (4, 8, 16, 32):
        assert exponential(n).spectral_gap == pytest.approx(2 / (1 + math.log2(n)), abs=1e-9)
    assert topology("complete", 7).spectral_gap == pytest.approx(1.0)
    assert torus(16).spectral_gap > ring(16).spectral_gap      # degree 4 mixes faster than degree 2
    assert ring(4).in_neighbours(0) == [1, 3] and exponential(8).in_neighbours(0) == [1, 2, 4]
    assert exponential(8).out_neighbours(0) == [4, 6, 7]


def test_bad_mixing_matrices_are_named():
    with pytest.raises(ValueError, match=r"not doubly stochastic: columns \[0, 1\] sum to \[0\.8, 1\.2\]"):
        check_mixing([[0.5, 0.5, 0.0], [0.3, 0.5, 0.2], [0.0, 0.2, 0.8]])
    with pytest.raises(ValueError, match=r"disconnected: 2 groups of ranks \[\[0, 1\], \[2, 3\]\]"):
        from_matrix(torch.block_diag(torch.full((2, 2), 0.5), torch.full((2, 2), 0.5)))
    with pytest.raises(ValueError, match=r"negative"):
        check_mixing([[1.5, -0.5], [-0.5, 1.5]])
    with pytest.raises(ValueError, match=r"W is 2x2 but world_size=3"):
        from_matrix(torch.full((2, 2), 0.5), world_size=3)


def test_config_names_every_bad_field_at_once():
    bad = DecentralizedConfig(topology="star", steps=0, local_steps=0, gossip_steps=0, order="x", alpha=0.5,
                              straggler_rank=9)
    with pytest.raises(ValueError) as e:
        bad.validate(4)
    for part in ("steps=0", "local_steps=0: need an integer >= 1 (H", "gossip_steps=0", "order='x'",
                 "N * alpha <= 1", "straggler_rank=9", "topology='star'"):
        assert part in str(e.value)


def test_bad_input_raises_on_every_rank_before_any_message(world):
    w = world(4)
    W = torch.full((4, 4), 0.25)
    W[0, 0], W[0, 1] = 0.5, 0.0                    # row 0 still sums to 1, column 0 does not
    with pytest.raises(WorkerError, match=r"not doubly stochastic: columns \[0, 1\]") as e:
        w.run(TRAIN["dpsgd"], DecentralizedConfig(topology=W, steps=3), MODEL, TRAIN_SET)
    assert "ranks [0, 1, 2, 3] raised" in str(e.value)
    with pytest.raises(WorkerError, match=r"local_steps=0: need an integer >= 1"):
        w.run(TRAIN["local_sgd"], DecentralizedConfig(local_steps=0, steps=3), MODEL, TRAIN_SET)
    assert not w.broken and w.run(lambda: 1) == [1] * 4          # nobody was left blocked


# --- gossip --------------------------------------------------------------------------

def _gossip_rank(name, numel):
    import torch.distributed as dist

    from ddnb.decentralized import gossip, topology
    from ddnb.trace import Tracer

    tr = Tracer()
    x = torch.arange(numel, dtype=torch.float32) * (dist.get_rank() + 1)
    mixed = gossip(x, topology(name, dist.get_world_size()), tracer=tr)
    return mixed, sum(e["nbytes"] for e in tr.events if e["kind"] == "send")


@pytest.mark.parametrize("name", list(TOPOLOGIES))
def test_one_gossip_step_is_W_times_X_with_out_degree_messages(world, name):
    got = world(4).run(_gossip_rank, name, 5)
    topo = topology(name, 4)
    X = torch.stack([torch.arange(5, dtype=torch.float64) * (r + 1) for r in range(4)])
    expected = topo.W @ X
    for r, (mixed, sent) in enumerate(got):
        assert torch.allclose(mixed.double(), expected[r], atol=1e-6)
        assert sent == len(topo.out_neighbours(r)) * 5 * 4


# --- every method = its single-process simulation, bytes = formula --------------------

CASES = [("allreduce_sgd", "sgd", {}), ("local_sgd", "local_sgd", {"local_steps": 3}),
         ("local_sgd", "local_sgd", {"local_steps": 4, "warmup_steps": 2}),
         ("adpsgd", "adpsgd", {"topology": "ring"}), ("adpsgd", "adpsgd", {"topology": "exponential"}),
         ("easgd", "easgd", {"local_steps": 2})]
CASES += [("dpsgd", "dpsgd", {"topology": t, "order": o, "gossip_steps": k})
          for t in TOPOLOGIES for o, k in (("atc", 1), ("lian", 2))]


@pytest.mark.parametrize("method, sim, kw", CASES, ids=[f"{m}-{kw}" for m, _, kw in CASES])
def test_each_method_equals_its_simulation_and_its_byte_formula(world, method, sim, kw):
    config = DecentralizedConfig(steps=10, lr=0.1, measure_every=5, **kw)
    results = world(4).run(TRAIN[method], config, MODEL, TRAIN_SET)
    assert (params(results) - simulate(sim, config, MODEL, TRAIN_SET, 4)).abs().max().item() < 1e-6
    predicted = run_bytes(method, config, 4, NUMEL)
    assert [r["bytes_sent"] for r in results] == [p["sent"] for p in predicted]
    assert [r["bytes_received"] for r in results] == [p["received"] for p in predicted]


def test_an_emulated_run_counts_the_bytes_too():
    """The traced bytes are counted between the run's start and end on the trace's own
    clock, so an emulated cluster (whose events carry emulated times) counts them too."""
    from ddnb.emulate import get_profile
    from ddnb.testing import World

    config = DecentralizedConfig(steps=4, lr=0.1, measure_every=2, topology="ring", gossip_steps=1)
    with World(3, emulate=get_profile("10gbe").with_(slowdown=20), timeout=120) as w:
        results = w.run(TRAIN["dpsgd"], config, MODEL, TRAIN_SET)
    predicted = run_bytes("dpsgd", config, 3, NUMEL)
    assert [r["bytes_sent"] for r in results] == [p["sent"] for p in predicted] and predicted[0]["sent"] > 0
    assert [r["bytes_received"] for r in results] == [p["received"] for p in predicted]


# --- the equivalences ----------------------------------------------------------------

def torch_sgd(config, n):
    """Single-process SGD with torch.optim.SGD on the N workers' batches concatenated."""
    model = MODEL()
    opt = torch.optim.SGD(model.parameters(), lr=config.lr)
    for t in range(config.steps):
        xs, ys = zip(*[worker_batch(TRAIN_SET, i, n, config.batch_size, t, config.seed) for i in range(n)])
        opt.zero_grad()
        F.cross_entropy(model(torch.cat(xs)), torch.cat(ys)).backward()
        opt.step()
    return flat_params(model)


def _torch_allreduce_sgd(config):
    """Synchronous SGD with torch.distributed's own all_reduce of the gradients."""
    import torch.distributed as dist

    from ddnb.models import load_flat
    from ddnb.parameter_server.worker import forward_backward

    n, rank, model = dist.get_world_size(), dist.get_rank(), MODEL()
    x = flat_params(model)
    for t in range(config.steps):
        xb, yb = worker_batch(TRAIN_SET, rank, n, config.batch_size, t, config.seed)
        _, g = forward_backward(model, x, xb, yb, F.cross_entropy)
        dist.all_reduce(g)
        x = x - config.lr * g / n
    return load_flat(model, x) and x


def test_complete_graph_dpsgd_equals_allreduce_sgd_and_local_sgd_h1(world):
    config = DecentralizedConfig(topology="complete", steps=15, lr=0.1)
    w = world(4)
    dpsgd = params(w.run(TRAIN["dpsgd"], config, MODEL, TRAIN_SET))
    local1 = params(w.run(TRAIN["local_sgd"], config, MODEL, TRAIN_SET))
    ours = params(w.run(TRAIN["allreduce_sgd"], config, MODEL, TRAIN_SET))
    theirs = torch.stack(w.run(_torch_allreduce_sgd, config))
    reference = torch_sgd(config, 4)
    for got in (dpsgd, local1, ours, theirs):
        assert (got - reference).abs().max().item() < 1e-6
    assert (dpsgd - ours).abs().max().item() < 1e-6 and (local1 - ours).abs().max().item() < 1e-6
    lian = params(w.run(TRAIN["dpsgd"], DecentralizedConfig(topology="complete", steps=15, order="lian"),
                        MODEL, TRAIN_SET))
    assert (lian - reference).abs().max().item() > 1e-4      # Lian's order is not SGD (the docstring says why)


@pytest.mark.parametrize("method, kw", [("allreduce_sgd", {}), ("local_sgd", {"local_steps": 3}),
                                        ("dpsgd", {"topology": "ring"}), ("dpsgd", {"order": "lian"}),
                                        ("adpsgd", {}), ("easgd", {"local_steps": 2}), ("decentralized_ps", {})])
def test_with_one_worker_every_method_is_single_process_sgd(world, method, kw):
    config = DecentralizedConfig(steps=12, lr=0.1, **kw)
    (result,) = world(1).run(TRAIN[method], config, MODEL, TRAIN_SET)
    if method == "easgd":     # the elastic pull toward the lagging center remains: its own recursion
        assert (result["params"] - simulate("easgd", config, MODEL, TRAIN_SET, 1)[0]).abs().max() < 1e-6
        assert (result["params"] - torch_sgd(config, 1)).abs().max() > 1e-4
    else:
        assert (result["params"] - torch_sgd(config, 1)).abs().max().item() < 1e-6
    assert result["bytes_sent"] == 0


def test_dpsgd_converges_on_digits_and_ring_spreads_more_than_complete(world):
    w = world(4)
    ring_run = w.run(TRAIN["dpsgd"], DecentralizedConfig(topology="ring", steps=150, measure_every=50),
                     MODEL, TRAIN_SET, TEST_SET)
    full_run = w.run(TRAIN["dpsgd"], DecentralizedConfig(topology="complete", steps=150, measure_every=50),
                     MODEL, TRAIN_SET, TEST_SET)
    assert ring_run[0]["measured"][-1]["accuracy"] > 0.9
    assert ring_run[0]["measured"][-1]["consensus"] > 100 * full_run[0]["measured"][-1]["consensus"]
    assert full_run[0]["measured"][-1]["consensus"] < 1e-5
    assert all(r["measured"] == ring_run[0]["measured"] for r in ring_run)   # measured alike on every rank


def test_a_straggler_changes_the_timing_not_the_arithmetic(world):
    config = DecentralizedConfig(topology="ring", steps=6, straggler_rank=2, straggler_delay=0.02)
    results = world(4).run(TRAIN["adpsgd"], config, MODEL, TRAIN_SET)
    assert (params(results) - simulate("adpsgd", config, MODEL, TRAIN_SET, 4)).abs().max().item() < 1e-6


def test_decentralized_ps_converges_with_exact_bytes_and_no_server_rank(world):
    config = DecentralizedConfig(steps=60, lr=0.1, straggler_rank=3, straggler_delay=0.002)
    results = world(4).run(TRAIN["decentralized_ps"], config, MODEL, TRAIN_SET, TEST_SET)
    assert results[0]["measured"][-1]["accuracy"] > 0.8
    assert all(torch.equal(r["params"], results[0]["params"]) for r in results)   # one model, in shards
    assert [r["updates"] for r in results] == [4 * 60] * 4                      # every push applied once
    predicted = run_bytes("decentralized_ps", config, 4, NUMEL)
    assert [r["bytes_sent"] for r in results] == [p["sent"] for p in predicted]
    assert [r["bytes_received"] for r in results] == [p["received"] for p in predicted]


# --- Hogwild! ------------------------------------------------------------------------

def test_hogwild_one_process_is_serial_sgd_and_two_processes_learn():
    from ddnb.bench.hogwild import hogwild
    from ddnb.decentralized.hogwild import serial_sgd, sparse_logistic

    data = sparse_logistic(examples=1000, dim=200, nnz=5)
    one = hogwild(data, processes=1, steps=400)
    assert torch.equal(one["w"], serial_sgd(data, steps=400)) and one["conflicts"] == 0 and one["updates"] == 400
    two = hogwild(data, processes=2, steps=800)
    assert two["updates"] == 1600 and 0 <= two["conflict_rate"] <= 1
    assert two["loss"] < 0.6 * two["loss_before"]         # log 2 = 0.693 at w = 0
    with pytest.raises(ValueError, match=r"nnz=300 > dim=200"):
        sparse_logistic(dim=200, nnz=300)
