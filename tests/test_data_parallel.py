"""ddnb.data_parallel: the sampler's shards cover the dataset exactly once per epoch;
replicas start bit-identical or every rank raises; NaiveDataParallel, BucketedDataParallel
(several buckets, torch's and the from-scratch ring all-reduce), torch DDP and Horovod each
train to the same parameters (1e-5) as one process on the global batch; gradient
accumulation with no_sync equals a bigger batch; unused parameters never hang (DDP's
find_unused_parameters semantic); gradient norms disagree before sync and agree after;
the trace gives the overlap; Horovod's timeline is captured and parsed; bad input fails
before anything blocks; the gradient plots draw from plain data.

Every distributed test is one World.run on a 2-rank world that trains a small model for
a few steps and returns what it found, so the file stays well under a minute on 2 cores.
"""
import os
import time
from collections import Counter

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from conftest import requires_horovod
from ddnb.data_parallel import (BucketedDataParallel, NaiveDataParallel, ReplicaMismatchError, ShardSampler,
                                assign_buckets, check_replicas, checksum, overlap_stats, replicate, shard_indices)

B, STEPS, LR, MOMENTUM = 4, 10, 0.1, 0.9   # per-rank batch, steps, SGD


# ---------------------------------------------------------------- shared by the ranks
def make_model(seed=0, hidden=16):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, hidden), nn.Tanh(), nn.Linear(hidden, 16), nn.Tanh(), nn.Linear(16, 3))


def global_batches(world_size, steps=STEPS, per_rank=B):
    """The global batch of each step, (N·B, 6) and (N·B, 3); rank r's shard is rows r·B..(r+1)·B-1."""
    g = torch.Generator().manual_seed(123)
    return [(torch.randn(world_size * per_rank, 6, generator=g), torch.randn(world_size * per_rank, 3, generator=g))
            for _ in range(steps)]


def shard(t, rank, per_rank=B):
    return t[rank * per_rank:(rank + 1) * per_rank]


def reference_params(world_size, steps=STEPS, per_rank=B):
    """One process, the whole global batch each step: what data parallelism must reproduce."""
    model = make_model(seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for x, y in global_batches(world_size, steps, per_rank):
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach() for p in model.parameters()]


def max_error(model, ref):
    return max((p.detach() - r).abs().max().item() for p, r in zip(model.parameters(), ref))


def train(strategy, allreduce="torch"):
    """10 SGD steps with `strategy` from a different initial model on every rank (seed =
    rank: replication must make them rank 0's); returns (max |param - reference|, the
    parameters' checksums, number of buckets)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    model = make_model(seed=rank)
    sync, buckets = (lambda: None), None
    if strategy == "naive":
        model = NaiveDataParallel(model, allreduce=allreduce)
        sync = model.sync_gradients
    elif strategy == "bucketed":   # ~1 KB buckets: 3 of them for this model
        model = BucketedDataParallel(model, bucket_mb=0.001, first_bucket_mb=None, allreduce=allreduce)
        buckets = len(model.buckets)
    elif strategy == "ddp":
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    if strategy == "horovod":
        from ddnb.data_parallel import horovod_optimizer

        opt = horovod_optimizer(model, opt)
    for x, y in global_batches(n):
        opt.zero_grad()
        F.mse_loss(model(shard(x, rank)), shard(y, rank)).backward()
        sync()
        opt.step()
    return max_error(model, reference_params(n)), [checksum(p) for p in model.parameters()], buckets


@pytest.mark.parametrize("strategy, allreduce", [("naive", "torch"), ("naive", "ring"), ("bucketed", "torch"),
                                                 ("bucketed", "ring"), ("bucketed", "tree"), ("ddp", None)])
def test_matches_single_process_on_the_global_batch(world, strategy, allreduce):
    results = world(2).run(train, strategy, allreduce)
    for error, sums, buckets in results:
        assert error < 1e-5
        assert sums == results[0][1]            # replicas bit-identical after 10 steps
        assert buckets in (None, 3)


# ---------------------------------------------------------------- no_sync, unused parameters
def accumulate(steps=4):
    """Two micro-batches per step, the first under no_sync: the same as one batch of both."""
    from ddnb.trace import Tracer

    rank, n = dist.get_rank(), dist.get_world_size()
    tracer = Tracer()
    model = BucketedDataParallel(make_model(seed=0), bucket_mb=0.001, first_bucket_mb=None, tracer=tracer)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    unsynced_differ = []
    for x, y in global_batches(n, steps, 2 * B):   # rank r: rows 2rB..2(r+1)B-1, two micro-batches of B
        xr, yr = shard(x, rank, 2 * B), shard(y, rank, 2 * B)
        opt.zero_grad()
        with model.no_sync():
            (F.mse_loss(model(xr[:B]), yr[:B]) / 2).backward()
        g = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        every = [torch.empty_like(g) for _ in range(n)]
        dist.all_gather(every, g)
        unsynced_differ.append(not torch.equal(every[0], every[1]))
        (F.mse_loss(model(xr[B:]), yr[B:]) / 2).backward()
        opt.step()
    events = tracer.take()
    n_buckets = sum(e["kind"] == "collective" for e in events) // steps
    return max_error(model, reference_params(n, steps, 2 * B)), all(unsynced_differ), n_buckets, len(model.buckets)


def test_no_sync_accumulation_equals_a_bigger_batch(world):
    for error, unsynced_differ, launched, buckets in world(2).run(accumulate):
        assert error < 1e-5
        assert unsynced_differ               # no communication inside no_sync
        assert launched == buckets           # one all-reduce per bucket per step, not two


class Branchy(nn.Module):
    """A trunk and three heads: `a` always used, `b` only when asked, `c` never."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.trunk, self.a, self.b, self.c = nn.Linear(6, 8), nn.Linear(8, 3), nn.Linear(8, 3), nn.Linear(8, 3)

    def forward(self, x, use_b):
        h = torch.tanh(self.trunk(x))
        return self.a(h) + self.b(h) if use_b else self.a(h)


def unused(strategy, find_unused, steps=4):
    """Head b is used on rank 0 only, head c on no rank. Returns (max error vs one process
    whose loss is the mean of the ranks' losses, c.weight.grad: None or its abs max)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    model, sync = Branchy(), (lambda: None)
    if strategy == "naive":
        model = NaiveDataParallel(model)
        sync = model.sync_gradients
    elif strategy == "bucketed":
        model = BucketedDataParallel(model, bucket_mb=0.0002, first_bucket_mb=None, find_unused_parameters=find_unused)
    else:
        model = nn.parallel.DistributedDataParallel(model, find_unused_parameters=find_unused)
    ref = Branchy()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=LR, momentum=MOMENTUM)
    for x, y in global_batches(n, steps):
        opt.zero_grad()
        F.mse_loss(model(shard(x, rank), rank == 0), shard(y, rank)).backward()
        sync()
        opt.step()
        ref_opt.zero_grad()
        sum(F.mse_loss(ref(shard(x, r), r == 0), shard(y, r)) for r in range(n)).div(n).backward()
        ref_opt.step()
    inner = getattr(model, "module", model)
    c_grad = inner.c.weight.grad
    c_max = None if c_grad is None else c_grad.abs().max().item()
    return max_error(inner, [p.detach() for p in ref.parameters()]), c_max


@pytest.mark.parametrize("strategy, find_unused, c_grad", [("bucketed", True, None), ("ddp", True, None),
                                                           ("bucketed", False, 0.0), ("naive", None, 0.0)])
def test_unused_parameters_do_not_hang(world, strategy, find_unused, c_grad):
    for error, got_c_grad in world(2).run(unused, strategy, find_unused):
        assert error < 1e-5
        assert got_c_grad == c_grad   # None: no rank had a gradient (DDP's semantic); 0.0: zeros


# ---------------------------------------------------------------- norms, trace, overlap
def norms_and_events(strategy, steps=3):
    from ddnb.trace import Tracer

    rank, n = dist.get_rank(), dist.get_world_size()
    tracer = Tracer()
    if strategy == "naive":
        model = NaiveDataParallel(make_model(), record_grad_norms=True, tracer=tracer)
    else:
        model = BucketedDataParallel(make_model(), bucket_mb=0.001, first_bucket_mb=None, record_grad_norms=True,
                                     tracer=tracer)
    ref = make_model()
    for x, y in global_batches(n, steps):
        model.zero_grad()
        F.mse_loss(model(shard(x, rank)), shard(y, rank)).backward()
        if strategy == "naive":
            model.sync_gradients()
        ref.zero_grad()
        F.mse_loss(ref(x), y).backward()   # no step: the weights stay put, every step is comparable
    return model.grad_norm_history, [p.grad.norm().item() for p in ref.parameters()], tracer.take(), model.names


@pytest.mark.parametrize("strategy", ["naive", "bucketed"])
def test_gradient_norms_differ_before_sync_and_agree_after(world, strategy):
    (h0, ref, ev0, names), (h1, _, ev1, _) = world(2).run(norms_and_events, strategy)
    assert len(h0) == len(h1) == 3 and len(h0[-1]["before"]) == len(names) == 6
    for s0, s1 in zip(h0, h1):
        assert all(abs(a - b) > 1e-6 for a, b in zip(s0["before"], s1["before"]))
        assert s0["after"] == s1["after"]
    assert h0[-1]["after"] == pytest.approx(ref, rel=1e-5)   # the global batch's gradient (last step)
    if strategy == "bucketed":
        from ddnb.viz.gradients import plot_bucket_timeline

        events = ev0 + ev1
        per_step = Counter((e["rank"], e["step"], e["kind"]) for e in events)
        assert set(per_step.values()) <= {1, 3} and per_step[(1, 2, "collective")] == 3
        for e in events:
            assert e["end"] >= e["start"]
        for rank, step in {(e["rank"], e["step"]) for e in events}:
            bw_end = next(e["end"] for e in events if (e["rank"], e["step"], e["name"]) == (rank, step, "backward"))
            launched = {e["bucket"]: e["start"] for e in events
                        if (e["rank"], e["step"], e["kind"]) == (rank, step, "collective")}
            assert sorted(launched) == [0, 1, 2]
            # overlap: bucket 0 (the last layer's) is launched while backward still computes the
            # earlier layers' gradients, and every bucket by the end of backward
            assert launched[0] < launched[2] <= bw_end and launched[0] < bw_end, (rank, step, launched, bw_end)
        stats = overlap_stats(events)
        assert stats["steps"] == stats["launched_in_backward"] == 6 and stats["comm"] > 0
        assert 0 < stats["fraction"] <= 1 and stats["overlapped"] > 0
        ax = plot_bucket_timeline(events)
        assert len(ax.get_yticklabels()) == 4
        import matplotlib.pyplot as plt

        plt.close("all")


def test_overlap_stats_from_synthetic_events():
    ev = [{"rank": 0, "kind": "compute", "name": "backward", "start": 0.0, "end": 10.0, "step": 0},
          {"rank": 0, "kind": "collective", "name": "bucket 0", "start": 4.0, "end": 8.0, "step": 0, "bucket": 0},
          {"rank": 0, "kind": "collective", "name": "bucket 1", "start": 6.0, "end": 14.0, "step": 0, "bucket": 1},
          {"rank": 1, "kind": "compute", "name": "backward", "start": 0.0, "end": 10.0, "step": 0},
          {"rank": 1, "kind": "collective", "name": "bucket 0", "start": 10.0, "end": 12.0, "step": 0, "bucket": 0}]
    # rank 0: comm = [4, 14] = 10, of it before 10: 6, launched at 4 < 10; rank 1: 2, none hidden,
    # launched at 10, when backward had ended (not before it)
    assert overlap_stats(ev) == {"comm": 12.0, "overlapped": 6.0, "fraction": 0.5, "backward": 20.0,
                                 "launched_in_backward": 1, "steps": 2}
    assert overlap_stats([])["fraction"] == 0.0


# ---------------------------------------------------------------- replicas
def mismatches():
    """Every way replicas can differ; each must raise on every rank (returns the messages)."""
    rank = dist.get_rank()
    got = {}
    model = make_model(seed=0)
    if rank == 1:
        with torch.no_grad():
            model[2].weight[0, 0] += 1e-3
    for name, build in [("values", lambda: check_replicas(model)),
                        ("no broadcast", lambda: BucketedDataParallel(make_model(seed=rank), broadcast=False)),
                        ("architecture", lambda: BucketedDataParallel(make_model(hidden=16 + rank))),
                        ("bucket size", lambda: BucketedDataParallel(make_model(), bucket_mb=1 + rank)),
                        ("naive architecture", lambda: NaiveDataParallel(make_model(hidden=16 + rank)))]:
        try:
            build()
            got[name] = None
        except ReplicaMismatchError as e:
            got[name] = str(e)
    replicate(model)      # now equal: no error, and bit-identical to rank 0's
    check_replicas(model)
    got["checksums"] = [checksum(p) for p in model.parameters()]
    return got


def test_replicas_that_differ_raise_on_every_rank(world):
    r0, r1 = world(2).run(mismatches)
    for got in (r0, r1):
        assert "'2.weight' values differ" in got["values"] and "ranks [0]" in got["values"]
        assert "'0.weight' values differ" in got["no broadcast"]
        assert "(16, 6) float32" in got["architecture"] and "(17, 6) float32" in got["architecture"]
        assert "config 'bucket_mb': ranks [0]: 1.0; ranks [1]: 2.0" in got["bucket size"]
        assert "tensor #0" in got["naive architecture"]
    assert r0["checksums"] == r1["checksums"]


@pytest.mark.parametrize("bucket_mb", [0, -1, float("nan"), float("inf"), True, "25"])
def test_bad_bucket_size_fails_before_any_collective(bucket_mb):
    # no process group in this process: a collective would raise something else
    assert not dist.is_initialized()
    with pytest.raises(ValueError,
                       match=r"^BucketedDataParallel: bucket_mb=.*: need a (finite )?number > 0 \(megabytes\)$"):
        BucketedDataParallel(nn.Linear(2, 2), bucket_mb=bucket_mb)
    with pytest.raises(ValueError, match=r"first_bucket_mb=-1"):
        BucketedDataParallel(nn.Linear(2, 2), first_bucket_mb=-1)
    with pytest.raises(ValueError, match=r"allreduce='butterfly' is not one of \('torch', 'naive', 'tree', 'ring'"):
        BucketedDataParallel(nn.Linear(2, 2), allreduce="butterfly")


def test_assign_buckets_reverse_order_and_sizes():
    assert assign_buckets([4, 4, 4, 4], [0] * 4, 8) == [[3, 2], [1, 0]]
    assert assign_buckets([4, 4, 4, 4], [0] * 4, 8, first_bucket_bytes=4) == [[3], [2, 1], [0]]
    assert assign_buckets([4, 100, 4], [0] * 3, 8) == [[2], [1], [0]]      # too big: a bucket of its own
    assert assign_buckets([4, 4, 4], [0, 1, 1], 100) == [[2, 1], [0]]      # one dtype per bucket
    assert assign_buckets([], [], 8) == []


# ---------------------------------------------------------------- sampler
@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 200), replicas=st.integers(1, 12), epoch=st.integers(0, 5), seed=st.integers(0, 99),
       shuffle=st.booleans(), drop_last=st.booleans())
def test_shards_cover_the_dataset_once_per_epoch(n, replicas, epoch, seed, shuffle, drop_last):
    if replicas > n:
        with pytest.raises(ValueError, match=rf"num_replicas={replicas} > num_items={n}"):
            shard_indices(n, replicas, 0, epoch, seed, shuffle, drop_last)
        return
    shards = [shard_indices(n, replicas, r, epoch, seed, shuffle, drop_last) for r in range(replicas)]
    assert len({len(s) for s in shards}) == 1                       # same batch count everywhere
    counts = Counter(i for s in shards for i in s)
    rest = n % replicas
    if rest == 0:
        assert counts == Counter(range(n))                          # exactly once
    elif drop_last:
        assert set(counts.values()) == {1} and len(counts) == n - rest   # the last n mod N dropped
    else:
        assert set(counts) == set(range(n))                         # everything, plus repeats
        assert sum(counts.values()) == n + replicas - rest and max(counts.values()) == 2
    assert len(ShardSampler(n, replicas, 0, shuffle=shuffle, seed=seed, drop_last=drop_last)) == len(shards[0])


def test_reshuffled_each_epoch_and_not_when_asked():
    e0, e1 = (shard_indices(100, 4, 1, epoch, seed=7) for epoch in (0, 1))
    assert e0 != e1 and sorted(e0) != e0
    assert shard_indices(10, 3, 1, epoch=5, shuffle=False) == [1, 4, 7, 0]   # padded with item 0


def sampler_on_each_rank(n_items):
    s = ShardSampler(n_items, seed=3)
    out = []
    for epoch in (0, 1):
        s.set_epoch(epoch)
        out.append(list(s))
    return out


def test_sampler_on_real_ranks_is_disjoint_and_identical_permutation(world):
    (a0, a1), (b0, b1) = world(2).run(sampler_on_each_rank, 11)
    for mine, other in ((a0, b0), (a1, b1)):
        assert len(mine) == len(other) == 6 and set(mine + other) == set(range(11))
        assert len(set(mine) & set(other)) <= 1          # only the one padding repeat can be shared
    assert (a0, b0) != (a1, b1)                           # a new permutation in epoch 1
    assert (a0, b0) == tuple(shard_indices(11, 2, r, 0, seed=3) for r in range(2))


def test_sampler_bad_input():
    with pytest.raises(ValueError, match=r"num_replicas=4 > num_items=3.*num_replicas <= len\(dataset\)"):
        ShardSampler(list("abc"), num_replicas=4, rank=0)
    with pytest.raises(ValueError, match=r"rank=2 is not in 0..1"):
        ShardSampler(10, num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="initialize torch.distributed"):
        ShardSampler(10)
    with pytest.raises(TypeError, match=r"^ShardSampler: num_replicas=1.5: need an int; rank='0': need an int; "
                                        r"shuffle=None: need True or False$"):
        ShardSampler(10, num_replicas=1.5, rank="0", shuffle=None)
    with pytest.raises(ValueError,
                       match=r"seed=-9223372036854775809 is not in .*; num_replicas=0: need an integer >= 1"):
        ShardSampler(10, num_replicas=0, rank=0, seed=-2 ** 63 - 1)
    loader = torch.utils.data.DataLoader(list(range(10)), batch_size=2, sampler=ShardSampler(10, 2, 1, shuffle=False))
    assert [b.tolist() for b in loader] == [[1, 3], [5, 7], [9]]


# ---------------------------------------------------------------- Horovod
@pytest.fixture(scope="module")
def hvd_world():
    """A 2-rank Horovod world of this module's own (ddnb.runtime.horovod sets
    HOROVOD_TIMELINE=DYNAMIC, so hvd.start_timeline works), closed at the end of the module
    so that its background thread does not slow the other tests."""
    from ddnb.testing import World

    w = World(2, timeout=60, horovod=True)
    yield w
    w.close()


@requires_horovod
def test_horovod_matches_single_process_and_writes_a_timeline(hvd_world, tmp_path):
    from ddnb.data_parallel import horovod_timeline, horovod_timeline_events
    from ddnb.viz.gradients import plot_horovod_timeline

    def run(path):
        start = time.time()
        with horovod_timeline(path):
            got = train("horovod")
        return got, start, time.time()

    path = str(tmp_path / "timeline.json")
    results = hvd_world.run(run, path)
    for (error, sums, _), _, _ in results:
        assert error < 1e-5 and sums == results[0][0][1]
    events = horovod_timeline_events(path)
    tensors = {e["tensor"] for e in events}
    assert {f"allreduce.{n}" for n in ("0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias")} <= tensors
    assert {e["activity"] for e in events} >= {"ALLREDUCE", "GLOO_ALLREDUCE"}
    collectives = [e for e in events if e["activity"] == "GLOO_ALLREDUCE"]
    assert len(collectives) >= STEPS and all(e["kind"] == "collective" and e["leaf"] for e in collectives)
    start, end = min(r[1] for r in results), max(r[2] for r in results)
    assert all(start - 1 <= e["start"] <= e["end"] <= end + 1 for e in events)   # time.time() seconds
    ax = plot_horovod_timeline(events)
    assert {t.get_text() for t in ax.get_yticklabels()} == tensors
    import matplotlib.pyplot as plt

    plt.close("all")


@requires_horovod
def test_horovod_helpers_refuse_before_init(tmp_path, monkeypatch):
    from ddnb.data_parallel import horovod_optimizer, horovod_timeline

    model = make_model()
    with pytest.raises(ValueError, match="Horovod is not initialized"):
        horovod_optimizer(model, torch.optim.SGD(model.parameters(), lr=0.1))
    monkeypatch.delenv("HOROVOD_TIMELINE", raising=False)
    with pytest.raises(ValueError, match="must be 'DYNAMIC' before hvd.init"):
        with horovod_timeline(str(tmp_path / "t.json")):
            pass


def test_timeline_parser_reads_an_unterminated_file(tmp_path):
    from ddnb.data_parallel import horovod_timeline_events

    path = tmp_path / "t.json"
    path.write_text('[\n{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": '
                    '1000000}},\n{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "allreduce.w"}},\n'
                    '{"ph": "E", "ts": 5, "pid": 1},{"ph": "B", "name": "ALLREDUCE", "ts": 10, "pid": 1},'
                    '{"ph": "B", "name": "GLOO_ALLREDUCE", "ts": 12, "pid": 1},{"ph": "E", "ts": 20, "pid": 1},'
                    '{"ph": "E", "ts": 21, "pid": 1, "args": {"shape": "[3]"}},')
    events = horovod_timeline_events(str(path), rank=0)
    assert [(e["activity"], e["depth"], e["leaf"]) for e in events] == [("ALLREDUCE", 0, False),
                                                                      ("GLOO_ALLREDUCE", 1, True)]
    assert events[0]["start"] == pytest.approx(1.00001) and events[0]["end"] == pytest.approx(1.000021)
    assert events[1]["name"] == "allreduce.w: GLOO_ALLREDUCE" and events[1]["kind"] == "collective"


# ---------------------------------------------------------------- plots from plain data
def test_gradient_heatmap_and_explorer_from_plain_data():
    import matplotlib.pyplot as plt

    from ddnb.viz.gradients import GradientFlowExplorer, plot_gradient_heatmap, stack_history

    names = ["0.weight", "0.bias", "2.weight"]
    history = [[{"step": s, "before": [1.0 + r + s, 0.1 * (r + 1), 0.0], "after": [1.5 + s, 0.15, 0.0]}
                for s in range(3)] for r in range(2)]
    before, after = stack_history(history)
    assert len(before) == 3 and before[1] == [[2.0, 0.1, 0.0], [3.0, 0.2, 0.0]]
    axes = plot_gradient_heatmap(before[0], after[0], names, highlight=1)
    assert [t.get_text() for t in axes[0].get_xticklabels()] == names
    with pytest.raises(ValueError, match=r"one norm per layer \(3 layer names\), got row lengths \[2, 3\]"):
        plot_gradient_heatmap([[1, 2], [1, 2]], [[1, 2, 3], [1, 2, 3]], names)
    plt.close("all")
    explorer = GradientFlowExplorer(before, after, names)
    first = explorer.image.value
    assert first[:4] == b"\x89PNG"
    explorer.step.value = 2
    explorer.layer.value = 1
    assert explorer.image.value != first and explorer.step.max == 2
    with pytest.raises(ValueError, match="same number"):
        GradientFlowExplorer(before, after[:1], names)
    assert plt.get_fignums() == []           # the widget closes the figures it draws
