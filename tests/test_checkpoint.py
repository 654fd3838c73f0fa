"""Resumable data-parallel training (ddnb.data_parallel.checkpoint, train_digits).

A run stopped after step 7 with a checkpoint every 4 steps leaves on disk what a run
killed then leaves (the checkpoint of step 4; steps 5-7 lost); called again it resumes
from step 4 and ends with the same parameters and losses, bit for bit, as a run that was
never stopped, for every strategy, with dropout on (so each rank's generator must be
restored too) and across an epoch boundary (so the sampler's position must be). The
real kill (SIGKILL of an engine of a ddnb.Cluster, then restart and resume) is in
tests/test_lost_workers.py.
"""
import random

import numpy as np
import pytest
import torch

from conftest import requires_horovod
from ddnb.data_parallel import ShardSampler
from ddnb.data_parallel.checkpoint import checkpoints, latest_checkpoint, rng_state, set_rng_state
from ddnb.data_parallel.train import train_digits

# 674 training digits on 2 ranks: 337 each, 10 steps of 32 an epoch, so 12 steps cross into epoch 1
STEPS = 12
SMALL = dict(per_rank=32, hidden=32, dropout=0.2)


def same_run(a, b):
    for x, y in zip(a, b):
        assert torch.equal(x["params"], y["params"])
        assert x["losses"] == y["losses"]
        assert x["accuracy"] == y["accuracy"]


@pytest.mark.parametrize("strategy, every, stop", [("naive", 4, 7), ("bucketed", 4, 7), ("ddp", 4, 7),
                                                   ("ddp", 5, 11)])
def test_a_stopped_run_resumed_equals_one_never_stopped(world, tmp_path, strategy, every, stop):
    w = world(2)
    whole = w.run(train_digits, strategy, steps=STEPS, **SMALL)
    first = w.run(train_digits, strategy, steps=stop, checkpoint_dir=str(tmp_path), checkpoint_every=every, **SMALL)
    assert [r["resumed_from"] for r in first] == [None, None]
    at = stop // every * every                            # 4: mid-epoch; 10: the end of epoch 0
    assert [s for s, _ in checkpoints(tmp_path)][-1] == at
    rest = w.run(train_digits, strategy, steps=STEPS, checkpoint_dir=str(tmp_path), checkpoint_every=every, **SMALL)
    assert [r["resumed_from"] for r in rest] == [at, at]
    same_run(rest, whole)
    assert len(rest[0]["losses"]) == STEPS


def test_dropout_and_the_sampler_are_what_a_resume_must_restore(world, tmp_path):
    """Had the resume not restored them, the runs would differ: another seed for the dropout
    masks alone, or the epoch's data from its first item, gives other parameters."""
    w = world(2)
    whole = w.run(train_digits, "ddp", steps=STEPS, **SMALL)
    other = w.run(train_digits, "ddp", steps=STEPS, **dict(SMALL, dropout=0.21))
    assert not torch.equal(whole[0]["params"], other[0]["params"])
    no_dropout = w.run(train_digits, "ddp", steps=STEPS, **dict(SMALL, dropout=0.0))
    assert not torch.equal(whole[0]["params"], no_dropout[0]["params"])


@requires_horovod
def test_horovod_resumes_too(world, tmp_path):
    w = world(2, horovod=True)
    whole = w.run(train_digits, "horovod", steps=STEPS, **SMALL)
    w.run(train_digits, "horovod", steps=7, checkpoint_dir=str(tmp_path), checkpoint_every=4, **SMALL)
    rest = w.run(train_digits, "horovod", steps=STEPS, checkpoint_dir=str(tmp_path), checkpoint_every=4, **SMALL)
    assert rest[0]["resumed_from"] == 4
    same_run(rest, whole)


def test_checkpoints_kept_and_partial_ones_ignored(world, tmp_path):
    w = world(2)
    out = w.run(train_digits, "ddp", steps=12, checkpoint_dir=str(tmp_path), checkpoint_every=4, keep=2, **SMALL)
    assert [s for s, _ in checkpoints(tmp_path)] == [8, 12]
    assert out[0]["checkpoint"] == str(tmp_path / "step-000012")
    assert sorted(p.name for p in (tmp_path / "step-000012").iterdir()) == ["rank-00000.pt", "rank-00001.pt",
                                                                              "state.pt"]
    (tmp_path / "step-000016.partial").mkdir()           # a crash while writing step 16
    (tmp_path / "step-000016.partial" / "rank-00000.pt").write_bytes(b"torn")
    assert latest_checkpoint(tmp_path).name == "step-000012"
    again = w.run(train_digits, "ddp", steps=12, checkpoint_dir=str(tmp_path), **SMALL)
    assert again[0]["resumed_from"] == 12 and again[0]["losses"] == out[0]["losses"]


def test_resume_false_starts_over(world, tmp_path):
    w = world(2)
    w.run(train_digits, "ddp", steps=8, checkpoint_dir=str(tmp_path), checkpoint_every=4, **SMALL)
    out = w.run(train_digits, "ddp", steps=3, checkpoint_dir=str(tmp_path), resume=False, **SMALL)
    assert out[0]["resumed_from"] is None and len(out[0]["losses"]) == 3
    assert checkpoints(tmp_path) == []                   # no stale step 8 left to be resumed later


def test_a_resume_with_other_settings_is_refused_naming_them(world, tmp_path):
    w = world(2)
    w.run(train_digits, "ddp", steps=4, checkpoint_dir=str(tmp_path), checkpoint_every=4, **SMALL)
    with pytest.raises(Exception, match=r"lr: checkpoint 0\.05, this run 0\.1, per_rank: checkpoint 32, this run 16"):
        w.run(train_digits, "ddp", steps=8, checkpoint_dir=str(tmp_path), lr=0.1, **dict(SMALL, per_rank=16))
    with pytest.raises(Exception, match="world_size: checkpoint 2, this run 3"):
        world(3).run(train_digits, "ddp", steps=8, checkpoint_dir=str(tmp_path), **SMALL)
    with pytest.raises(Exception, match="at step 4, past steps=2"):
        w.run(train_digits, "ddp", steps=2, checkpoint_dir=str(tmp_path), **SMALL)
    assert w.run(lambda: 1) == [1, 1]                     # refused before any collective: the world is fine


@pytest.mark.parametrize("kwargs, match", [(dict(checkpoint_every=4), "needs checkpoint_dir"),
                                           (dict(checkpoint_dir="x", checkpoint_every=0), "checkpoint_every"),
                                           (dict(checkpoint_dir="x", keep=0), "keep"),
                                           (dict(dropout=1.0), "dropout")])
def test_bad_checkpoint_arguments_fail_before_any_process_blocks(kwargs, match):
    with pytest.raises(ValueError, match=match):
        train_digits("ddp", steps=4, **kwargs)


def test_rng_state_round_trip():
    state = rng_state()
    drawn = (torch.rand(3), random.random(), np.random.rand())
    set_rng_state(state)
    again = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(drawn[0], again[0]) and drawn[1:] == again[1:]


def test_sampler_state_round_trip_and_refusals():
    a = ShardSampler(100, num_replicas=4, rank=1, seed=3)
    a.set_epoch(2)
    a.start = 10
    b = ShardSampler(100, num_replicas=4, rank=1, seed=3)
    b.load_state_dict(a.state_dict())
    assert list(b) == a.indices()[10:] and len(list(b)) == 15
    b.set_epoch(2)                                         # the resumed epoch keeps its place
    assert b.start == 10
    b.set_epoch(3)
    assert b.start == 0
    with pytest.raises(ValueError, match="rank: saved 1, here 2"):
        ShardSampler(100, num_replicas=4, rank=2, seed=3).load_state_dict(a.state_dict())
    with pytest.raises(ValueError, match="past the shard"):
        ShardSampler(100, num_replicas=4, rank=1, seed=3).load_state_dict(dict(a.state_dict(), start=26))
    with pytest.raises(ValueError, match=r"ShardSampler.load_state_dict: start=-1: need an integer >= 0"):
        ShardSampler(100, num_replicas=4, rank=1, seed=3).load_state_dict(dict(a.state_dict(), start=-1))
