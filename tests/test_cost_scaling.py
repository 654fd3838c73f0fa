"""ddnb.cost.scaling: each scheme's step time against numbers worked out by hand at p = 8
and p = 4096, crossovers found by hand, the two-level schemes reducing to the flat ring,
monotonicity (hypothesis), bad input, and the widget's error path. No processes needed."""
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddnb.cost import allreduce_time
from ddnb.cost.scaling import (NETWORKS, NVLINK, STEP_ALGORITHMS, Network, communication_time, compute_time,
                               crossover, efficiency, grid_shape, hierarchical_allreduce_time, network,
                               parameter_server_time, ring_latency_takeover, step_time, step_times,
                               torus2d_allreduce_time)

A, B = 1e-5, 1e-9          # 10 us a message, 1 GB/s
S = 1e6                    # bytes
NET = Network(A, 1e9, "test")   # 1e9 B/s: beta = 1e-9


def test_network_alpha_beta():
    assert NET.alpha == A and NET.beta == pytest.approx(B, rel=1e-15)
    net = network(100, 5)
    assert net.beta == pytest.approx(8e-11) and net.alpha == pytest.approx(5e-6)
    assert NETWORKS["400G InfiniBand"].beta == pytest.approx(2e-11)


# comm seconds of S = 1e6 bytes on NET, by hand:
# p = 8:
#   ps_central:   2*8*(1e-5 + 1e-3)              = 1.616e-2
#   ps_sharded k=4: server 2*8*(1e-5 + 2.5e-4)   = 4.16e-3  (worker: 8e-5 + 2e-3 = 2.08e-3)
#   tree:         2*3*(1e-5 + 1e-3)              = 6.06e-3
#   ring:         14e-5 + 2*7/8*1e-3             = 1.89e-3
#   hd:           6e-5 + 1.75e-3                 = 1.81e-3
#   torus2d 2x4:  2*3*1e-5 + 2*1*1e-5 + 1.75e-3  = 1.83e-3
# p = 4096:
#   ps_central:   2*4096*(1.01e-3)               = 8.27392
#   ps_sharded k=4: 2*4096*(1e-5 + 2.5e-4)       = 2.12992
#   tree:         24*(1.01e-3)                   = 2.424e-2
#   ring:         2*4095*1e-5 + 2*4095/4096*1e-3 = 8.19e-2 + 1.99951171875e-3
#   hd:           24e-5 + 1.99951171875e-3
#   torus2d 64x64: 2*63*1e-5 * 2 + 1.99951171875e-3 = 2.52e-3 + 1.99951171875e-3
BY_HAND = {
    8: {"ps_central": 1.616e-2, "ps_sharded": 4.16e-3, "tree": 6.06e-3, "ring": 1.89e-3,
        "halving_doubling": 1.81e-3, "torus2d": 1.83e-3},
    4096: {"ps_central": 8.27392, "ps_sharded": 2.12992, "tree": 2.424e-2, "ring": 8.19e-2 + 1.99951171875e-3,
           "halving_doubling": 2.4e-4 + 1.99951171875e-3, "torus2d": 2.52e-3 + 1.99951171875e-3},
}


@pytest.mark.parametrize("p", [8, 4096])
@pytest.mark.parametrize("algorithm", ["ps_central", "ps_sharded", "tree", "ring", "halving_doubling", "torus2d"])
def test_communication_by_hand(algorithm, p):
    got = communication_time(algorithm, S / 4, p, NET, bytes_per_param=4, servers=4)
    assert got == pytest.approx(BY_HAND[p][algorithm], rel=1e-12)


# hierarchical, 8 per node on INTRA (1 us, 1e10 B/s), ring of m nodes on NET, S/8 bytes each:
# p = 8 (one node): 2*7*1e-6 + 2*7/8*1e6*1e-10 = 1.4e-5 + 1.75e-4 = 1.89e-4
# p = 4096 (512 nodes): 1.89e-4 + 2*511*1e-5 + 2*511/512*1.25e5*1e-9 = 1.89e-4 + 1.022e-2 + 2.4951171875e-4
INTRA = Network(1e-6, 1e10, "intra")


@pytest.mark.parametrize("p, expected", [(8, 1.89e-4), (4096, 1.89e-4 + 1.022e-2 + 2.4951171875e-4)])
def test_hierarchical_by_hand(p, expected):
    assert communication_time("hierarchical", S / 4, p, NET, per_node=8, intra=INTRA) == pytest.approx(expected,
                                                                                                     rel=1e-12)
    assert hierarchical_allreduce_time(S, p, 8, INTRA, NET) == pytest.approx(expected, rel=1e-12)


def test_gamma_terms_by_hand():
    g = 1e-10
    # central server sums N vectors: + N S gamma;  ring: + (p-1)/p S gamma
    assert parameter_server_time(S, 8, A, B, g) == pytest.approx(1.616e-2 + 8 * S * g)
    assert communication_time("ring", S / 4, 8, NET, gamma=g) == pytest.approx(1.89e-3 + 7 / 8 * S * g)
    # 2D torus: (cols-1)/cols S + (rows-1)/rows S/cols = (p-1)/p S reduced, as the ring
    assert torus2d_allreduce_time(S, 4, 16, A, B, g) - torus2d_allreduce_time(S, 4, 16, A, B) == pytest.approx(
        63 / 64 * S * g)


def test_step_time_adds_or_overlaps_compute():
    comm = communication_time("ring", S / 4, 8, NET)
    assert step_time("ring", S / 4, 8, 0.01, NET) == pytest.approx(0.01 + comm)
    assert step_time("ring", S / 4, 8, 0.01, NET, overlap=True) == 0.01
    assert step_time("ring", S / 4, 8, 1e-4, NET, overlap=True) == pytest.approx(comm)
    assert step_time("ring", S / 4, 1, 0.01, NET) == 0.01            # one worker talks to no one
    eff = efficiency({1: 0.01, 8: 0.01 + comm}, 0.01)
    assert eff[1] == 1.0 and eff[8] == pytest.approx(0.01 / (0.01 + comm))


def test_buckets_pay_latency_each():
    # S = 1e6 in buckets of 2.5e5: 4 ring all-reduces of 2.5e5 bytes on 8 workers
    got = communication_time("ring", S / 4, 8, NET, bucket_bytes=2.5e5)
    assert got == pytest.approx(4 * (14e-5 + 7 / 4 * 2.5e5 * B))
    assert got - communication_time("ring", S / 4, 8, NET) == pytest.approx(3 * 14e-5)
    # a bucket larger than the gradient: one all-reduce
    assert communication_time("ring", S / 4, 8, NET, bucket_bytes=1e9) == communication_time("ring", S / 4, 8, NET)


def test_two_level_schemes_reduce_to_flat_ring():
    for p in (2, 4, 8, 16):
        flat_intra = allreduce_time("ring", S, p, INTRA.alpha, INTRA.beta, 1e-10)
        flat_inter = allreduce_time("ring", S, p, NET.alpha, NET.beta, 1e-10)
        assert hierarchical_allreduce_time(S, p, p, INTRA, NET, 1e-10) == pytest.approx(flat_intra, rel=1e-12)  # 1 node
        # one worker per node: the flat ring on the network between nodes
        assert hierarchical_allreduce_time(S, p, 1, INTRA, NET, 1e-10) == pytest.approx(flat_inter, rel=1e-12)
        assert torus2d_allreduce_time(S, 1, p, A, B, 1e-10) == pytest.approx(flat_inter, rel=1e-12)
        assert torus2d_allreduce_time(S, p, 1, A, B, 1e-10) == pytest.approx(flat_inter, rel=1e-12)
        if p <= 8:  # at most per_node workers: one node, the flat ring on the intra-node link
            assert communication_time("hierarchical", S / 4, p, NET, per_node=8, intra=INTRA) == pytest.approx(
                allreduce_time("ring", S, p, INTRA.alpha, INTRA.beta), rel=1e-12)


def test_torus_has_ring_bytes_and_fewer_messages():
    for p in (16, 64, 4096):
        rows, cols = grid_shape(p)
        assert rows * cols == p and rows <= cols <= 2 * rows
        assert torus2d_allreduce_time(S, rows, cols, 0.0, B) == pytest.approx(allreduce_time("ring", S, p, 0.0, B))
        assert torus2d_allreduce_time(S, rows, cols, A, 0.0) == pytest.approx(2 * (rows + cols - 2) * A)
    assert grid_shape(8) == (2, 4) and grid_shape(4096) == (64, 64) and grid_shape(1) == (1, 1)


def test_crossover_tree_beats_ring_by_hand():
    # Pure latency (beta = 0): tree 2 lg p alpha vs ring 2(p-1) alpha; equal at p = 2, 3; tree wins from 4.
    tree = lambda n: allreduce_time("tree", S, n, A, 0.0)
    ring = lambda n: allreduce_time("ring", S, n, A, 0.0)
    assert crossover(tree, ring, range(2, 100)) == 4
    # S = 1 MiB, alpha = 5 us, 100 Gb/s (beta = 8e-11): S beta = 8.388608e-5. On p = 2^k:
    #   p = 64:  tree 12*(5e-6 + 8.388608e-5) = 1.0666e-3 ; ring 126*5e-6 + 2*63/64*8.388608e-5 = 7.95e-4  (ring)
    #   p = 128: tree 14*(8.888608e-5) = 1.2444e-3 ; ring 1.27e-3 + 1.665e-4 = 1.4365e-3               (tree)
    net = network(100, 5)
    mib = 1 << 20
    tree = lambda n: allreduce_time("tree", mib, n, net.alpha, net.beta)
    ring = lambda n: allreduce_time("ring", mib, n, net.alpha, net.beta)
    assert tree(64) > ring(64) and tree(128) < ring(128)
    assert crossover(tree, ring, [2 ** k for k in range(1, 13)]) == 128
    # 100 MB (ResNet-50 in fp32): the ring wins all the way to 4096
    tree = lambda n: allreduce_time("tree", 1e8, n, net.alpha, net.beta)
    ring = lambda n: allreduce_time("ring", 1e8, n, net.alpha, net.beta)
    assert crossover(tree, ring, [2 ** k for k in range(1, 13)]) is None


def test_ring_latency_takeover_by_hand():
    # N >= n beta / alpha: 1e6 * 1e-9 / 1e-5 = 100
    assert ring_latency_takeover(S, A, B) == 100
    lat = lambda n: 2 * (n - 1) * A
    bw = lambda n: 2 * (n - 1) / n * S * B
    assert lat(100) >= bw(100) and lat(99) < bw(99)
    # 25 MiB buckets on 100 Gb/s, 5 us: 26214400 * 8e-11 / 5e-6 = 419.43 -> 420
    assert ring_latency_takeover(25 << 20, 5e-6, 8e-11) == 420
    assert ring_latency_takeover(1, 1.0, 1e-9) == 2


def test_compute_time():
    assert compute_time(6 * 1.3e9 * 2048, 312e12, 0.5) == pytest.approx(6 * 1.3e9 * 2048 / 156e12)


@settings(max_examples=60, deadline=None)
@given(algorithm=st.sampled_from(STEP_ALGORITHMS), k=st.integers(3, 11),
       params=st.floats(1e5, 1e10), bucket=st.sampled_from([None, 1e6, 25e6]))
def test_more_workers_never_faster(algorithm, k, params, bucket):
    """Weak scaling: communication time never falls as workers double (same model, same network)."""
    kw = dict(bytes_per_param=2, servers=8, bucket_bytes=bucket)
    net = NETWORKS["100G Ethernet"]
    t1 = communication_time(algorithm, params, 2 ** k, net, **kw)
    t2 = communication_time(algorithm, params, 2 ** (k + 1), net, **kw)
    assert t2 >= t1 * (1 - 1e-12)


@settings(max_examples=60, deadline=None)
@given(algorithm=st.sampled_from(STEP_ALGORITHMS), k=st.integers(1, 12), params=st.floats(1e5, 1e10))
def test_faster_network_and_smaller_model_never_slower(algorithm, k, params):
    slow, fast = NETWORKS["100G Ethernet"], NETWORKS["400G InfiniBand"]
    assert (communication_time(algorithm, params, 2 ** k, fast)
            <= communication_time(algorithm, params, 2 ** k, slow) * (1 + 1e-12))
    assert (communication_time(algorithm, params / 2, 2 ** k, slow)
            <= communication_time(algorithm, params, 2 ** k, slow) * (1 + 1e-12))


def test_step_times_and_efficiency_shape():
    times = step_times(["ring", "tree"], [8, 64], 25.6e6, 0.1, NETWORKS["100G Ethernet"])
    assert set(times) == {"ring", "tree"} and set(times["ring"]) == {8, 64}
    eff = efficiency(times["ring"], 0.1)
    assert 0 < eff[64] <= eff[8] <= 1


@pytest.mark.parametrize("call, words", [
    (lambda: communication_time("ring", 1e6, 0, NET), "workers=0"),
    (lambda: communication_time("ring", 1e6, 2.5, NET), "workers=2.5"),
    (lambda: communication_time("ring", -1e6, 8, NET), "num_params=-1000000.0"),
    (lambda: communication_time("ring", 1e6, 8, NET, bytes_per_param=0), "bytes_per_param=0"),
    (lambda: communication_time("ring", 1e6, 8, NET, bucket_bytes=-5), "bucket_bytes=-5"),
    (lambda: communication_time("ring", 1e6, 8, "fast"), "'fast'"),
    (lambda: communication_time("ring", 1e6, 8, Network(1e-6, -1e9, "bad")), "net.bandwidth=-1000000000.0"),
    (lambda: communication_time("ring", 1e6, 8, Network(-1e-6, 1e9, "bad")), "net.alpha=-1e-06"),
    (lambda: communication_time("butterfly", 1e6, 8, NET), "'butterfly'"),
    (lambda: communication_time("ps_sharded", 1e6, 8, NET, servers=0), "servers=0"),
    (lambda: communication_time("torus2d", 1e6, 12, NET), "workers=12 is not a power of two"),
    (lambda: communication_time("hierarchical", 1e6, 12, NET, per_node=8), "workers=12"),
    (lambda: hierarchical_allreduce_time(1e6, 12, 8, INTRA, NET), "per_node=8"),
    (lambda: communication_time("hierarchical", 1e6, 16, NET, inter_algorithm="mesh"), "'mesh'"),
    (lambda: network(-100, 5), "bandwidth_gbps=-100"),
    (lambda: network(0, 5), "bandwidth_gbps=0"),
    (lambda: network(100, -1), "latency_us=-1"),
    (lambda: network(math.nan, 1), "bandwidth_gbps=nan"),
    (lambda: step_time("ring", 1e6, 8, -0.1, NET), "compute_time=-0.1"),
    (lambda: compute_time(1e12, 1e14, 1.5), "utilization=1.5"),
    (lambda: torus2d_allreduce_time(1e6, 0, 4, A, B), "rows=0"),
    (lambda: torus2d_allreduce_time(1e6, 2, 4, A, -B), "beta=-1e-09"),
    (lambda: parameter_server_time(1e6, 8, -A, B), "alpha=-1e-05"),
    (lambda: ring_latency_takeover(1e6, 0.0, B), "alpha=0.0"),
    (lambda: efficiency({8: 1.0}, 0), "compute_time=0"),
])
def test_bad_input_names_the_value(call, words):
    with pytest.raises(ValueError, match=None) as info:
        call()
    assert words in str(info.value)


def test_every_bad_argument_is_named_at_once():
    with pytest.raises(ValueError) as info:
        communication_time("ring", 0, 8, "fast", servers=0, inter_algorithm="mesh")
    message = str(info.value)
    assert message.startswith("communication_time: ") and all(
        words in message for words in ("num_params=0", "servers=0", "net='fast'", "'mesh'")), message
    with pytest.raises(ValueError) as info:
        hierarchical_allreduce_time(-1.0, 12, 8, INTRA, None)
    assert all(words in str(info.value) for words in ("nbytes=-1.0", "per_node=8", "inter=None")), str(info.value)


def test_widget_shows_errors_instead_of_raising():
    import matplotlib
    matplotlib.use("Agg")
    from ddnb.viz.scaling_model import ScalingExplorer

    ex = ScalingExplorer({"tiny fp32": (1e6, 4, 0.01)}, NETWORKS, algorithms=["ring", "tree"], workers=[8, 16])
    assert ex.image.value and "2 algorithms" in ex.status.value
    ex.bandwidth.value = -5.0                      # a learner types a negative bandwidth
    assert "bandwidth_gbps=-5.0" in ex.status.value
    ex.bandwidth.value = 100.0
    ex.algorithms.value = ()
    assert "choose at least one algorithm" in ex.status.value
    ex.network.value = "400G InfiniBand"
    ex.algorithms.value = ("ring",)
    assert ex.bandwidth.value == 400.0 and ex.latency.value == pytest.approx(2.0)
    assert "1 algorithms" in ex.status.value


def test_plots_take_plain_data():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ddnb.viz.scaling_model import plot_efficiency, plot_predicted_vs_measured, plot_step_times

    ax = plot_step_times({"ring": {8: 0.1, 16: 0.2}}, compute_time=0.05)
    assert len(ax.lines) == 2
    assert len(plot_efficiency({"ring": {8: 0.9, 16: 0.8}}).lines) == 2
    assert len(plot_predicted_vs_measured({"ring": {2: 1e-3}}, {"ring": {2: 1.1e-3}}).lines) == 2
    plt.close("all")


def test_default_hierarchical_uses_nvlink():
    assert communication_time("hierarchical", 1e6, 8, NET) == pytest.approx(
        allreduce_time("ring", 4e6, 8, NVLINK.alpha, NVLINK.beta))


def test_hierarchical_inter_algorithm():
    # 4096 = 512 nodes x 8: halving-doubling across nodes: 2*9*1e-5 + 2*511/512*1.25e5*1e-9, plus the node's 1.89e-4
    got = communication_time("hierarchical", S / 4, 4096, NET, per_node=8, intra=INTRA,
                             inter_algorithm="halving_doubling")
    assert got == pytest.approx(1.89e-4 + 1.8e-4 + 2.4951171875e-4, rel=1e-12)
