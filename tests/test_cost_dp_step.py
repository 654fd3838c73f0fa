"""ddnb.cost.dp_step: the data-parallel step model (compute by the roofline, all-reduces by
alpha-beta, buckets on one link) and the bench's scaling columns built on it."""
import pytest
import torch
import torch.nn.functional as F

from ddnb.bench.dp import add_efficiency, bench_model, dp_scaling
from ddnb.cost import allreduce_time
from ddnb.cost.dp_step import ComputeTimes, compute_times, dp_step_time
from ddnb.emulate import get_profile

F32 = torch.float32


def times(ready, nbytes, forward=1.0, backward=3.0, optimizer=0.5):
    return ComputeTimes(forward, backward, optimizer, ready, nbytes, [F32] * len(nbytes))


def test_one_worker_is_compute_alone():
    t = times([3.0, 2.0], [8, 8])
    for s in ("naive", "bucketed", "ddp"):
        assert dp_step_time(t, s, 1, alpha=1.0, bandwidth=1.0)["step_time"] == 4.5


def test_naive_adds_one_ring_per_tensor_after_backward():
    t = times([3.0, 2.0], [100, 300])
    ring = lambda n: allreduce_time("ring", n, 4, 0.1, 1 / 50.0, 0.0)  # noqa: E731
    got = dp_step_time(t, "naive", 4, alpha=0.1, bandwidth=50.0)
    assert got["step_time"] == pytest.approx(4.5 + ring(100) + ring(300))
    assert got["overlap"] is None


def test_buckets_queue_on_the_link_and_overlap_is_the_hidden_share():
    # parameters 1 and 0 (reverse order) fill one bucket each; ready at 1 s and 2 s of backward
    t = times([2.0, 1.0], [1000, 1000], backward=3.0)
    alpha, bw = 0.0, 1000.0                # a ring of 2 workers moves 1000 bytes in 2 * 1/2 * 1000 / bw = 1 s
    got = dp_step_time(t, "bucketed", 2, alpha, bw, bucket_bytes=1000, first_bucket_bytes=1000)
    # bucket [1]: 1 -> 2; bucket [0]: ready at 2, link free at 2 -> 3; backward ends at 3
    assert got["step_time"] == pytest.approx(1.0 + 3.0 + 0.5)
    assert got["overlap"] == pytest.approx(1.0)
    slow = dp_step_time(t, "bucketed", 2, alpha, bw / 2, bucket_bytes=1000, first_bucket_bytes=1000)
    # 2 s each: 1 -> 3, then 3 -> 5: union [1, 5] = 4 s, of which [1, 3] before backward ends
    assert slow["step_time"] == pytest.approx(1.0 + 5.0 + 0.5)
    assert slow["overlap"] == pytest.approx(0.5)


def test_wrapper_passes_delay_backward_and_add_a_copy_out():
    t = times([2.0, 1.0], [1000, 1000], backward=3.0)
    got = dp_step_time(t, "bucketed", 1, 0.0, 1.0, bucket_bytes=1000, first_bucket_bytes=1000, memory_bandwidth=2000)
    # per bucket: copy in + divide = 2 passes of 2n / M = 2 s; copy out: 2 * 2000 / 2000 = 2 s
    assert got["step_time"] == pytest.approx(1.0 + (3.0 + 2 * 2.0) + 2.0 + 0.5)


def test_compute_times_charges_the_roofline_and_restores_the_model():
    model = bench_model("many_small", width=16, layers=3)
    before = [p.detach().clone() for p in model.parameters()]
    x = torch.zeros(4, 16)
    t = compute_times(model, x, x, F.mse_loss, "10gbe")
    assert t.forward > 0 and t.backward > t.forward and t.optimizer > 0
    # backward produces gradients last layer first: readiness falls with registration order
    assert t.ready[-1] <= t.ready[0] <= t.backward
    assert t.nbytes == [p.numel() * 4 for p in model.parameters()]
    assert all(torch.equal(a, b) and b.grad is None for a, b in zip(before, model.parameters()))
    fast = compute_times(model, x, x, F.mse_loss, get_profile("10gbe").with_(peak_flops=8.1e15,
                                                                             memory_bandwidth=320e12))
    assert fast.backward == pytest.approx(t.backward / 1000)


def test_bad_arguments_are_named_together():
    with pytest.raises(ValueError, match=r"strategy='ring'.*workers=0.*bandwidth=0.*memory_bandwidth=-1"):
        dp_step_time(times([1.0], [4]), "ring", 0, 0.0, 0, memory_bandwidth=-1)


def test_efficiency_is_one_worker_over_n():
    rows = [{"model": "m", "strategy": "ddp", "workers": n, "step_time": t, "model_step_time": 2 * t}
            for n, t in ((1, 1.0), (2, 1.25), (4, 2.0))]
    add_efficiency(rows)
    assert [r["efficiency"] for r in rows] == [1.0, 0.8, 0.5]
    assert [r["model_efficiency"] for r in rows] == [1.0, 0.8, 0.5]


def test_emulated_scaling_rows_carry_the_model():
    rows = dp_scaling([1, 2], ("many_small",), ("bucketed", "ddp"), batch=4, emulate=get_profile("ib").with_(
        slowdown=200), steps=1, warmup=1, rounds=1, width=32, layers=2)
    assert sorted((r["strategy"], r["workers"]) for r in rows) == [("bucketed", 1), ("bucketed", 2), ("ddp", 1),
                                                                  ("ddp", 2)]
    profile = get_profile("ib")
    ct = compute_times(bench_model("many_small", width=32, layers=2), torch.zeros(4, 32), torch.zeros(4, 32),
                       F.mse_loss, profile)
    for r in rows:
        assert r["emulated"] == "ib"
        assert r["model_step_time"] == pytest.approx(dp_step_time(   # the rows' own model: width 32, 2 layers
            ct, r["strategy"], r["workers"], profile.intra.alpha, profile.intra.bandwidth,
            memory_bandwidth=profile.memory_bandwidth)["step_time"])
        assert r["error"] == pytest.approx(r["step_time"] / r["model_step_time"] - 1)
        assert r["efficiency"] == (1.0 if r["workers"] == 1 else pytest.approx(
            next(o["step_time"] for o in rows if o["workers"] == 1 and o["strategy"] == r["strategy"]) / r["step_time"]))


@pytest.mark.parametrize("sizes", [[4096, 4194304, 4096, 4194304, 4096, 4194304], [100] * 7, [3 << 20, 8, 30 << 20, 8]])
def test_ddp_buckets_are_torchs(sizes):
    import torch.distributed as dist

    from ddnb.cost.dp_step import ddp_buckets

    params = [torch.empty(n // 4) for n in sizes]
    theirs, _ = dist._compute_bucket_assignment_by_size(list(reversed(params)), [1 << 20, 25 << 20],
                                                         [False] * len(params))
    n = len(sizes)
    assert ddp_buckets(sizes, [F32] * n, 25 << 20, 1 << 20) == [[n - 1 - i for i in b] for b in theirs]
