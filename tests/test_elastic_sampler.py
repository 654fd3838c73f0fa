"""ddnb.elastic.sampler: a world resized mid-epoch (4 -> 2 -> 3 ranks) reads every sample
of the epoch exactly once, the tail included (uneven shares, no padding, no dropping),
and the position and record survive a DCP checkpoint saved by 4 ranks, loaded by 3."""
import pytest
import torch.distributed as dist

from ddnb.data_parallel.sampler import shard_indices
from ddnb.elastic.checkpoint import load, save
from ddnb.elastic.sampler import ElasticSampler, exactly_once, remaining_indices, step_count


def run_steps(sampler, world_size, per_rank, steps=None):
    """Every rank's sampler (copies of one state) for `steps` steps (None: to the end)."""
    replicas = []
    for rank in range(world_size):
        s = ElasticSampler(sampler.num_items, seed=sampler.seed)
        s.load_state_dict(sampler.state_dict())
        replicas.append(s)
    k = 0
    while replicas[0].remaining() > 0 and (steps is None or k < steps):
        for rank, s in enumerate(replicas):
            s.next_batch(rank, world_size, per_rank)
        k += 1
    assert len({s.consumed for s in replicas}) == 1          # every rank agrees on the position
    merged = replicas[0]
    merged.history = sampler.record() + [e for s in replicas for e in s._own_entry()]
    merged.mine = []
    return merged


@pytest.mark.parametrize("num_items, per_rank", [(103, 5), (100, 4), (50, 3)])
def test_resized_mid_epoch_every_sample_exactly_once(num_items, per_rank):
    s = ElasticSampler(num_items, seed=3)
    s = run_steps(s, 4, per_rank, steps=2)                   # 8·per_rank read by 4 ranks
    s = run_steps(s, 2, per_rank, steps=1)                   # a removal
    s = run_steps(s, 3, per_rank)                            # an add, to the end of the epoch
    check = exactly_once(s.record(), num_items)
    assert check == {"read": num_items, "missing": [], "twice": [], "ok": True}
    assert {e["world_size"] for e in s.record()} == {4, 2, 3}


def test_a_record_with_a_gap_or_a_repeat_is_caught():
    record = [{"epoch": 0, "world_size": 2, "rank": 0, "indices": [0, 2, 2]},
              {"epoch": 0, "world_size": 2, "rank": 1, "indices": [1]}]
    assert exactly_once(record, 4) == {"read": 4, "missing": [3], "twice": [2], "ok": False}


def test_the_order_is_shard_indices_and_the_tail_is_uneven():
    s = ElasticSampler(10, seed=1)
    order = shard_indices(10, 1, 0, 0, 1)
    assert s.order() == order
    s.consumed = 3                                           # 7 left for 3 ranks: 3, 2, 2
    assert [s.indices(r, 3) for r in range(3)] == [order[3::3], order[4::3], order[5::3]]
    assert [len(s.indices(r, 3)) for r in range(3)] == [3, 2, 2]
    assert step_count(7, 4, 3) == 7 and step_count(70, 4, 3) == 12
    assert remaining_indices(order, 10, 1, 3) == []         # the epoch is read


def test_set_epoch_starts_a_new_permutation_and_keeps_the_record():
    s = ElasticSampler(6, seed=0)
    while s.remaining():
        s.next_batch(0, 1, 4)
    s.set_epoch(1)
    assert s.consumed == 0 and s.order() == shard_indices(6, 1, 0, 1, 0) != shard_indices(6, 1, 0, 0, 0)
    assert exactly_once(s.record(), 6, epoch=0)["ok"]


def test_bad_input_is_named():
    with pytest.raises(ValueError, match=r"num_items=0: .*; seed=-1"):
        ElasticSampler(0, seed=-1)
    s = ElasticSampler(5)
    with pytest.raises(ValueError, match=r"per_rank=0: .*; rank=2"):
        s.next_batch(2, 2, 0)
    s.next_batch(0, 2, 1)
    with pytest.raises(ValueError, match=r"rank 1 of 3 asked, but this sampler read as rank 0 of 2"):
        s.next_batch(1, 3, 1)
    with pytest.raises(ValueError, match=r"seed: saved 9, here 0"):
        s.load_state_dict({**s.state_dict(), "seed": 9})
    with pytest.raises(ValueError, match=r"consumed=6 is not in 0..5"):
        s.load_state_dict({**s.state_dict(), "consumed": 6})


def _save_sampler(directory):
    s = ElasticSampler(50, seed=2)
    for _ in range(3):
        s.next_batch(dist.get_rank(), dist.get_world_size(), 4)
    save({"sampler": s}, directory)
    return s.consumed


def _load_and_finish(directory):
    s = ElasticSampler(50, seed=2)
    load({"sampler": s}, directory)
    consumed = s.consumed
    while s.remaining():
        s.next_batch(dist.get_rank(), dist.get_world_size(), 4)
    return consumed, s.state_dict()["record"]


def test_dcp_carries_the_position_and_record_from_4_ranks_to_3(world, tmp_path):
    import json

    assert world(4).run(_save_sampler, str(tmp_path)) == [48] * 4
    got = world(3).run(_load_and_finish, str(tmp_path))
    assert [c for c, _ in got] == [48] * 3 and len({r for _, r in got}) == 1
    record = json.loads(got[0][1])
    assert [(e["world_size"], e["rank"], len(e["indices"])) for e in record] == \
        [(4, r, 12) for r in range(4)] + [(3, 0, 1), (3, 1, 1)]     # 2 left for 3 ranks: rank 2 reads none
    assert exactly_once(record, 50)["ok"]
