"""ddnb.data_pipeline: the three formats hold the same bytes; one epoch of sharded reading
on real ranks covers every sample exactly once (even and uneven shards, resumed mid-epoch
from saved state); a corrupt shard is named on every rank before any rank blocks; the
calculator against hand values; bad arguments named."""
import os

import pytest
import torch

from ddnb.data_pipeline import (FORMATS, GROWTH, ShardedReader, check_readable, drives_needed, make_images,
                                pipeline_bound, preprocess_cost, rank_spans, read_bandwidth, read_shard,
                                read_throughput, samples_per_s, write)
from ddnb.runtime.errors import WorkerError

N = 250                        # samples: shards of 60 leave an uneven last shard of 10


@pytest.fixture(scope="module")
def samples():
    return make_images(N, size=16, seed=3)


@pytest.fixture(scope="module")
def stored(samples, tmp_path_factory):
    root = tmp_path_factory.mktemp("formats")
    return {(fmt, n): write(samples[:n], str(root / f"{fmt}-{n}"), fmt, 60)      # n=240: four even shards
            for fmt in FORMATS for n in (N, 240)}


def keys_of(reader_args):
    """On a rank: every key its ShardedReader yields in epoch `epoch`, and the shards it opened."""
    import torch.distributed as dist

    stored, epoch, drop_last = reader_args
    reader = ShardedReader(stored, dist.get_world_size(), dist.get_rank(), seed=5, drop_last=drop_last)
    reader.set_epoch(epoch)
    opened = reader.shards()
    return [s.key for s in reader], opened


def test_generation_is_deterministic_and_encoded(samples):
    again = make_images(20, size=16, seed=3)
    assert [s.data for s in again] == [s.data for s in samples[:20]]
    assert samples[0].data[:2] == b"\xff\xd8" and make_images(1, encoding="PNG")[0].data[:4] == b"\x89PNG"
    assert [s.label for s in samples[:12]] == [i % 10 for i in range(12)]


@pytest.mark.parametrize("fmt", FORMATS)
def test_formats_round_trip_the_same_bytes(fmt, samples, stored):
    st = stored[(fmt, N)]
    assert st.sizes == (60, 60, 60, 60, 10) and len(st.shards) == 5 and stored[(fmt, 240)].sizes == (60,) * 4
    check_readable(st)
    got = [s for k in range(len(st.shards)) for s in read_shard(st, k)]
    assert got == samples                      # key, encoded bytes and label, in order


def test_spans_are_torch_tensor_split_of_the_epoch_order():
    sizes = [7, 3, 10, 1, 5]
    for world_size in (1, 2, 3, 4, 6):
        for epoch in (0, 1):
            spans = [rank_spans(sizes, world_size, r, epoch, seed=2) for r in range(world_size)]
            order = rank_spans(sizes, 1, 0, epoch, seed=2)          # the whole epoch, one rank
            stream = torch.tensor([k * 100 + j for k, b, e in order for j in range(b, e)])
            for r, part in enumerate(stream.tensor_split(world_size)):
                assert [k * 100 + j for k, b, e in spans[r] for j in range(b, e)] == part.tolist()
    assert rank_spans(sizes, 2, 0, 0, shuffle=False) == [(0, 0, 7), (1, 0, 3), (2, 0, 3)]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("n", [N, 240])
def test_one_epoch_on_real_ranks_reads_every_sample_exactly_once(world, stored, samples, fmt, n):
    st = stored[(fmt, n)]                      # uneven (60 x 4 + 10) or even (60 x 4) shards
    for epoch in (0, 1):
        got = world(3).run(keys_of, (st, epoch, False))
        keys = [k for ks, _ in got for k in ks]
        assert sorted(keys) == [s.key for s in samples[:n]]          # every sample, exactly once
        assert [len(ks) for ks, _ in got] == [len(p) for p in torch.arange(n).tensor_split(3)]
        assert all(len(opened) <= 3 for _, opened in got)           # 4-5 shards over 3 ranks: its own only


def test_drop_last_gives_every_rank_the_same_count(world, stored):
    got = world(4).run(keys_of, (stored[("webdataset", N)], 2, True))
    keys = [k for ks, _ in got for k in ks]
    assert [len(ks) for ks, _ in got] == [N // 4] * 4 and len(set(keys)) == len(keys) == N - N % 4


def resume(stored, epoch, stop_after):
    """On a rank: read `stop_after[rank]` samples, save the position, read the rest with a
    fresh reader restored from it."""
    import torch.distributed as dist

    rank, world_size = dist.get_rank(), dist.get_world_size()
    reader = ShardedReader(stored, world_size, rank, seed=1)
    reader.set_epoch(epoch)
    it, before = iter(reader), []
    for _ in range(stop_after[rank]):
        before.append(next(it).key)
    state = reader.state_dict()
    again = ShardedReader(stored, world_size, rank, seed=1)
    again.load_state_dict(state)
    return before, [s.key for s in again], state["start"]


@pytest.mark.parametrize("fmt", ["files", "litdata"])
def test_resumed_mid_epoch_reads_the_rest_exactly_once(world, stored, samples, fmt):
    stop_after = [0, 37, 83]                   # rank 2 stops past its first shard boundary
    got = world(3).run(resume, stored[(fmt, N)], 4, stop_after)
    before = [k for b, _, _ in got for k in b]
    after = [k for _, a, _ in got for k in a]
    assert [start for _, _, start in got] == stop_after
    assert not set(before) & set(after)
    assert sorted(before + after) == [s.key for s in samples]

def uninterrupted(stored, epoch):
    import torch.distributed as dist

    reader = ShardedReader(stored, dist.get_world_size(), dist.get_rank(), seed=1)
    reader.set_epoch(epoch)
    return [s.key for s in reader]


def test_a_resumed_epoch_is_the_uninterrupted_one(world, stored):
    got = world(3).run(resume, stored[("webdataset", N)], 4, [5, 60, 83])
    whole = world(3).run(uninterrupted, stored[("webdataset", N)], 4)
    assert [b + a for b, a, _ in got] == whole          # same samples, same order, on every rank


def test_saved_state_of_another_assignment_is_refused(stored):
    st = stored[("files", N)]
    state = ShardedReader(st, 3, 1, seed=1).state_dict()
    with pytest.raises(ValueError) as e:
        ShardedReader(st, 4, 1, seed=2).load_state_dict(state)
    assert "seed: saved 1, here 2" in str(e.value) and "world_size: saved 3, here 4" in str(e.value)
    with pytest.raises(ValueError, match="start=999"):
        ShardedReader(st, 3, 1, seed=1).load_state_dict({**state, "start": 999})


def read_then_barrier(stored):
    """On a rank: construct the reader (which checks every shard), then wait for the others."""
    import torch.distributed as dist

    reader = ShardedReader(stored, dist.get_world_size(), dist.get_rank())
    dist.barrier()
    return len(reader)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_corrupt_shard_is_named_on_every_rank_before_any_blocks(world, samples, tmp_path, fmt):
    st = write(samples[:100], str(tmp_path / fmt), fmt, 30)
    bad = st.shards[2]                       # rank 0 of 2 never reads shard 2: it must still raise
    if fmt == "files":
        os.remove(os.path.join(bad, sorted(os.listdir(bad))[0]))
    else:
        with open(bad, "r+b") as f:
            f.truncate(os.path.getsize(bad) // 2)
    with pytest.raises(ValueError, match="shard 2"):
        check_readable(st)
    with pytest.raises(WorkerError) as e:
        world(2).run(read_then_barrier, st, timeout=30)
    msg = str(e.value)
    assert "ranks [0, 1] raised" in msg and "blocked" not in msg and f"shard 2 ({bad})" in msg
    assert world(2).run(read_then_barrier, write(samples[:100], str(tmp_path / "ok"), fmt, 30)) == [50, 50]


def test_calculator_against_hand_values():
    assert samples_per_s(4096, 0.5) == 8192
    assert read_bandwidth(8192, 110e3, nodes=64) == pytest.approx(8192 * 110e3 / 64)   # 14.08 MB/s per node
    assert drives_needed(7e9, 3e9) == 3 and drives_needed(6e9, 3e9) == 2 and drives_needed(6e9, 3e9, 0.5) == 4
    p = pipeline_bound(workers=4, shard_samples=100, decode_s=2e-3, step_s=0.1, batch_size=200,
                       bytes_per_sample=1e5, read_bytes_per_s=1e8, open_s=0.01)
    assert p["storage"] == pytest.approx(200 * (1e-3 + 1e-4)) and p["decode"] == pytest.approx(0.1)
    assert p["compute"] == 0.1 and p["bound"] == "storage" and p["step_s"] == pytest.approx(0.22)
    p0 = pipeline_bound(workers=0, shard_samples=100, decode_s=2e-3, step_s=0.1, batch_size=200,
                        bytes_per_sample=1e5, read_bytes_per_s=1e8, open_s=0.01)
    assert p0["step_s"] == pytest.approx(0.22 + 0.4 + 0.1) and p0["bound"] == "decode"
    assert [r["year"] for r in GROWTH] == sorted(r["year"] for r in GROWTH) and all(r["source"] for r in GROWTH)


def test_measured_bytes_equal_the_stored_samples(stored, samples):
    for readers in (0, 2):
        r = read_throughput(stored[("webdataset", N)], readers=readers, cold=True)
        assert r["samples"] == N and r["bytes"] == sum(len(s.data) for s in samples)
        assert r["cold_ok"] is True and r["samples_per_s"] > 0 and 0 < r["first_batch_s"] <= r["total_s"]
    threads = torch.get_num_threads()
    cost = preprocess_cost(samples[:20])
    assert torch.get_num_threads() == threads and cost["threads"] == 1
    assert cost["samples"] == 20 and cost["decode_s"] > 0 and cost["augment_s"] > 0


def test_bad_arguments_are_named(samples, tmp_path):
    with pytest.raises(ValueError) as e:
        write(samples, str(tmp_path), "zip", 0)
    assert "fmt='zip'" in str(e.value) and "shard_size=0" in str(e.value)
    with pytest.raises(ValueError) as e:
        rank_spans([3, 0], 2, 0)
    assert "shard_sizes=[3, 0]" in str(e.value)
    with pytest.raises(ValueError) as e:
        rank_spans([3, 2], 9, 0)
    assert "num_replicas=9 > num_items=5" in str(e.value)
    with pytest.raises(ValueError) as e:
        pipeline_bound(workers=-1, shard_samples=0, decode_s=1e-3, step_s=0)
    assert all(s in str(e.value) for s in ("workers=-1", "shard_samples=0", "step_s=0"))
    with pytest.raises(ValueError, match="utilization=2"):
        drives_needed(1e9, 1e9, utilization=2)


def test_input_bound_plot_and_widget():
    from ddnb.viz import InputBoundExplorer, plot_input_bound

    ax = plot_input_bound({"storage": 0.01, "decode": 0.3, "compute": 0.1, "step_s": 0.3, "bound": "decode"})
    assert "input-bound: decode" in ax.get_title()
    ex = InputBoundExplorer(workers=2, decode_ms=2.0, step_ms=100.0, batch_size=256)
    assert ex.parts["bound"] == "decode" and ex.update(workers=16)["bound"] == "compute"
    assert "bound by compute" in ex.status.value
