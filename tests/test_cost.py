"""ddnb.cost.alpha_beta: each formula of Thakur et al. 2005 against numbers worked out by
hand, the bytes each rank sends, validation, the fit, and a real ping-pong."""
import math

import pytest

from ddnb.bench.links import measure_gamma, pingpong
from ddnb.collectives import ALLREDUCES
from ddnb.cost import ALGORITHMS, allreduce_bytes_per_rank, allreduce_time, fit_alpha_beta

A, B, G = 1e-5, 1e-9, 1e-10  # 10 us per message, 1 GB/s, 10 GB/s reduction
N = 1e6


# p = 4, n = 1e6 bytes, by hand:
#   ring:  2*3*A = 6e-5;  2*3/4*N*B = 1.5e-3;  3/4*N*G = 7.5e-5        -> 1.635e-3
#   hd:    2*lg4*A = 4e-5; 1.5e-3; 7.5e-5                               -> 1.615e-3
#   tree:  2*2*(A + N*B) = 4*(1.01e-3) = 4.04e-3;  2*N*G = 2e-4         -> 4.24e-3
#   naive: 2*3*(1.01e-3) = 6.06e-3;  3*N*G = 3e-4                       -> 6.36e-3
@pytest.mark.parametrize("algorithm, expected", [
    ("ring", 1.635e-3), ("halving_doubling", 1.615e-3), ("tree", 4.24e-3), ("naive", 6.36e-3)])
def test_formulas_p4_by_hand(algorithm, expected):
    assert allreduce_time(algorithm, N, 4, A, B, G) == pytest.approx(expected, rel=1e-12)


def test_ring_without_gamma():
    assert allreduce_time("ring", 1e6, 4, alpha=1e-5, beta=1e-9) == pytest.approx(6e-5 + 1.5e-3, rel=1e-12)


# p = 6, not a power of two:
#   tree:  ceil(lg 6) = 3: 6*(1.01e-3) = 6.06e-3;  3*N*G = 3e-4                     -> 6.36e-3
#   hd:    p' = 4 core (1.615e-3) + fold 2*(A + N*B) = 2.02e-3 + N*G = 1e-4          -> 3.735e-3
#   ring:  10*A = 1e-4;  10/6*N*B = 1.6667e-3;  5/6*N*G = 8.3333e-5                 -> 1.85e-3
#   naive: 10*(1.01e-3) = 1.01e-2;  5*N*G = 5e-4                                    -> 1.06e-2
@pytest.mark.parametrize("algorithm, expected", [
    ("ring", 1e-4 + 1e-3 / 0.6 + 5e-5 / 0.6), ("halving_doubling", 3.735e-3), ("tree", 6.36e-3),
    ("naive", 1.06e-2)])
def test_formulas_p6_by_hand(algorithm, expected):
    assert allreduce_time(algorithm, N, 6, A, B, G) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_one_rank_and_zero_bytes(algorithm):
    assert allreduce_time(algorithm, N, 1, A, B, G) == 0.0
    assert allreduce_bytes_per_rank(algorithm, N, 1) == [0.0]
    # zero bytes still pays the latency of every message
    latency = {"ring": 6 * A, "halving_doubling": 4 * A, "tree": 4 * A, "naive": 6 * A}[algorithm]
    assert allreduce_time(algorithm, 0, 4, A, B, G) == pytest.approx(latency)


def test_ring_and_halving_doubling_move_the_same_bytes_with_fewer_messages():
    for p in (2, 4, 8, 16):
        ring, hd = (allreduce_time(a, N, p, A, 0.0) for a in ("ring", "halving_doubling"))
        assert hd == pytest.approx(2 * math.log2(p) * A) and ring == pytest.approx(2 * (p - 1) * A)
        assert allreduce_time("ring", N, p, 0.0, B) == pytest.approx(allreduce_time("halving_doubling", N, p, 0.0, B))


@pytest.mark.parametrize("algorithm, p, expected", [
    ("ring", 4, [1.5e6] * 4),
    ("naive", 4, [3e6, 1e6, 1e6, 1e6]),
    ("tree", 4, [2e6, 1e6, 2e6, 1e6]),  # 0 -> 1, 2; 2 -> 3 in the broadcast
    ("tree", 5, [3e6, 1e6, 2e6, 1e6, 1e6]),  # 0 -> 1, 2, 4
    ("halving_doubling", 4, [1.5e6] * 4),
    ("halving_doubling", 6, [2.5e6, 1e6, 2.5e6, 1e6, 1.5e6, 1.5e6]),  # 1 -> 0, 3 -> 2 fold
])
def test_bytes_per_rank(algorithm, p, expected):
    assert allreduce_bytes_per_rank(algorithm, N, p) == pytest.approx(expected)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("p", [2, 3, 4, 5, 7, 8])
def test_total_traffic_is_2_p_minus_1_vectors(algorithm, p):
    assert sum(allreduce_bytes_per_rank(algorithm, N, p)) == pytest.approx(2 * (p - 1) * N)


@pytest.mark.parametrize("kwargs, match", [
    ({"algorithm": "butterfly"}, r"unknown all-reduce algorithm 'butterfly'; known: naive, tree, ring, halving_doubling"),
    ({"nbytes": -1}, r"nbytes=-1: need a number >= 0"),
    ({"world_size": 0}, r"world_size=0: need an integer >= 1"),
    ({"world_size": 2.0}, r"world_size=2.0: need an integer >= 1"),
    ({"alpha": -1e-6}, r"^allreduce_time: alpha=-1e-06: need a number >= 0$"),
    ({"beta": -1.0}, r"beta=-1.0: need a number >= 0"),
    ({"gamma": float("nan")}, r"gamma=nan: need a finite number >= 0"),
])
def test_validation(kwargs, match):
    args = {"algorithm": "ring", "nbytes": N, "world_size": 4, "alpha": A, "beta": B, "gamma": 0.0} | kwargs
    with pytest.raises(ValueError, match=match):
        allreduce_time(**args)


def test_every_bad_argument_is_named_at_once():
    with pytest.raises(ValueError) as info:
        allreduce_time("butterfly", -1, 0, alpha=-A, beta=B, gamma=math.inf)
    assert str(info.value) == ("allreduce_time: unknown all-reduce algorithm 'butterfly'; known: naive, tree, ring, "
                               "halving_doubling; nbytes=-1: need a number >= 0; world_size=0: need an integer >= 1; "
                               "alpha=-1e-05: need a number >= 0; gamma=inf: need a finite number >= 0")


def test_bytes_per_rank_validation():
    with pytest.raises(ValueError, match="known: naive, tree, ring, halving_doubling"):
        allreduce_bytes_per_rank("allgather", N, 4)


@pytest.mark.parametrize("relative", [True, False])
def test_fit_recovers_alpha_beta_exactly(relative):
    sizes = [4 << k for k in range(0, 25, 2)]
    times = [3e-5 + n * 7e-10 for n in sizes]
    alpha, beta = fit_alpha_beta(sizes, times, relative=relative)
    assert alpha == pytest.approx(3e-5, rel=1e-9) and beta == pytest.approx(7e-10, rel=1e-9)


def test_fit_is_non_negative():
    # times that fall with size would need beta < 0: beta is clamped to 0, alpha = weighted mean
    alpha, beta = fit_alpha_beta([1000, 2000], [2e-3, 1e-3], relative=False)
    assert (alpha, beta) == (pytest.approx(1.5e-3), 0.0)
    # a line through the origin with noise that makes the intercept negative: alpha = 0
    alpha, beta = fit_alpha_beta([1e3, 1e6, 2e6], [1e-7, 1e-3, 2.1e-3], relative=False)
    assert alpha == 0.0 and beta > 0


def test_fit_validation():
    with pytest.raises(ValueError, match="at least two different sizes"):
        fit_alpha_beta([4, 4], [1e-5, 1e-5])
    with pytest.raises(ValueError, match="need >= 2"):
        fit_alpha_beta([4, 8], [1e-5])
    with pytest.raises(ValueError, match="times > 0"):
        fit_alpha_beta([4, 8], [1e-5, 0.0])


def test_measure_gamma_is_a_plausible_add():
    gamma = measure_gamma(1 << 20, iters=5)
    assert 1e-13 < gamma < 1e-7  # between 10 TB/s and 10 MB/s


def test_pingpong_on_two_and_three_ranks(world):
    for n in (2, 3):
        got = world(n).run(pingpong, [4, 4096, 1 << 20], 3)
        assert all(g == got[0] for g in got)  # rank 0's times, broadcast to every rank
        assert len(got[0]) == 3 and all(t > 0 for t in got[0])  # (no ordering: 2 busy cores are noisy)


def test_pingpong_needs_two_ranks(world):
    from ddnb.runtime.errors import WorkerError

    with pytest.raises(WorkerError, match=r"pingpong needs a world of >= 2 ranks, got world_size=1"):
        world(1).run(pingpong, [4], 1)


def traced_bytes_sent(algorithm, numel):
    import torch

    from ddnb.trace import Tracer

    tracer = Tracer()
    ALLREDUCES[algorithm](torch.ones(numel), tracer=tracer, check=False)
    return sum(e["nbytes"] for e in tracer.take() if e["kind"] == "send")


@pytest.mark.parametrize("p", [4, 5])
def test_bytes_per_rank_match_the_collectives(world, p):
    """The model's per-rank bytes are what ddnb.collectives actually sends (960 float32
    elements divide evenly into every chunk and half here)."""
    assert set(ALGORITHMS) == set(ALLREDUCES)                      # the model covers every collective
    w = world(p)
    for algorithm in ALGORITHMS:
        assert w.run(traced_bytes_sent, algorithm, 960) == allreduce_bytes_per_rank(algorithm, 960 * 4, p), algorithm


def test_sendrecv_every_rank_gets_the_slowest(world):
    from ddnb.bench.links import sendrecv

    got = world(3).run(sendrecv, [4, 65536], 3)
    assert all(g == got[0] for g in got) and len(got[0]) == 2 and all(t > 0 for t in got[0])




def test_pair_exchange_same_answer_on_every_rank_and_bad_input(world):
    from ddnb.bench.links import pair_exchange
    from ddnb.runtime.errors import WorkerError

    for n, active in [(2, None), (3, None), (4, 2), (4, 4)]:
        got = world(n).run(pair_exchange, 4096, active, 20)
        assert all(g == got[0] for g in got), (n, active, got)
        seconds, cpu = got[0]
        assert seconds > 0 and cpu > 0
    with pytest.raises(WorkerError, match=r"active must be an integer in 2..3, got active=1"):
        world(3).run(pair_exchange, 4096, 1)
    with pytest.raises(WorkerError, match=r"pair_exchange needs a world of >= 2 ranks"):
        world(1).run(pair_exchange, 4096)
