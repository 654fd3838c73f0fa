"""ddnb.elastic.resize on a real ddnb.Cluster: the digits MLP trained on 4 workers, resized
to 2 (engines stopped) and to 3 (an engine started) in the middle of the epoch, through a
DCP checkpoint. After each resize every new rank holds exactly the parameters of before
(torch.equal); the epoch finishes with every sample read exactly once (the sampler's
record, gathered from all ranks); and the run follows one process reading the same
global batches (`reference_steps`), up to float rounding."""
import functools
import glob
import json
import os
import tempfile

import pytest
import torch

from ddnb import Cluster
from ddnb.elastic.resize import get, resize, start
from ddnb.elastic.sampler import exactly_once
from ddnb.elastic.train import digits_parts, reference_steps, train_steps

PER_RANK = 48


def _record():
    return json.loads(get("state")["sampler"].state_dict()["record"])


def _params():
    from ddnb.models import flat_params

    return flat_params(get("state")["model"].model)


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(n=4, timeout=60)
    yield c
    c.stop()


def test_resize_4_to_2_to_3_keeps_parameters_and_reads_each_sample_once(cluster, tmp_path):
    cluster.run(start, functools.partial(digits_parts, hidden=32, seed=0), "state")
    runs = [cluster.run(train_steps, "state", 3, PER_RANK)]                 # 3 steps of 192
    before = runs[-1][0]["params"]
    resize(cluster, 2, directory=tmp_path / "a")                            # a real removal
    assert cluster.n == 2 and all(torch.equal(p, before) for p in cluster.run(_params))
    runs.append(cluster.run(train_steps, "state", 2, PER_RANK))             # 2 steps of 96
    before, temporary = runs[-1][0]["params"], set(glob.glob(os.path.join(tempfile.gettempdir(), "ddnb-elastic-*")))
    cluster.resize(3, state="state")                                        # a real add, via Cluster
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "ddnb-elastic-*"))) == temporary   # removed once loaded
    assert cluster.n == 3 and all(torch.equal(p, before) for p in cluster.run(_params))
    runs.append(cluster.run(train_steps, "state", 100, PER_RANK))           # to the end of the epoch
    records = cluster.run(_record)
    assert all(r == records[0] for r in records)
    check = exactly_once(records[0], 1347)
    assert check == {"read": 1347, "missing": [], "twice": [], "ok": True}
    assert [e["world_size"] for e in records[0]] == [4] * 4 + [2] * 2 + [3] * 3
    counts = [c for run in runs for c in run[0]["counts"]]
    assert counts[:5] == [192] * 3 + [96] * 2 and sum(counts) == 1347 and counts[-1] < 144  # an uneven tail
    ref = reference_steps(counts, hidden=32, seed=0)
    assert torch.allclose(runs[-1][0]["params"], ref["params"], atol=1e-5)
    losses = [x for run in runs for x in run[0]["losses"]]
    assert max(abs(a - b) for a, b in zip(losses, ref["losses"])) < 1e-5


def test_bad_resize_is_named_before_anything_stops(cluster):
    pids, n = cluster.pids(), cluster.n
    with pytest.raises(ValueError, match=r"resize: n=0: need an integer >= 1 .*state='no state' must be the name"):
        resize(cluster, 0, state="no state")
    with pytest.raises(ValueError, match=r"rank\(s\) \[0, .*\] hold no ElasticState named 'missing'"):
        cluster.resize(2, state="missing")
    assert cluster.pids() == pids and cluster.n == n
