"""ddnb.data (digits, shard, batch) and ddnb.models (mlp, flat views, accuracy): no processes."""
import pytest
import torch

from ddnb.data import Dataset, batch, batch_indices, digits, shard
from ddnb.models import accuracy, flat_grads, flat_params, load_flat, mlp


@pytest.fixture(scope="module")
def splits():
    return digits()


def test_digits_shapes_dtypes_and_standardization(splits):
    train, test = splits
    assert len(train) + len(test) == 1797 and len(test) == 450
    assert train.x.shape == (len(train), 64) and train.x.dtype == torch.float32
    assert train.y.dtype == torch.int64 and set(train.y.tolist()) == set(range(10))
    varying = train.x.std(0) > 0
    assert torch.allclose(train.x.mean(0), torch.zeros(64), atol=1e-5)
    assert torch.allclose(train.x.std(0)[varying], torch.ones(int(varying.sum())), atol=1e-4)
    x, y = test                                   # a Dataset unpacks as (x, y)
    assert x.shape == (450, 64) and y.shape == (450,)


def test_digits_is_deterministic_and_seeded(splits):
    again, _ = digits()
    assert torch.equal(again.x, splits[0].x) and torch.equal(again.y, splits[0].y)
    other, _ = digits(seed=1)
    assert not torch.equal(other.y, splits[0].y)
    with pytest.raises(ValueError, match="test_size"):
        digits(test_size=1.5)


def test_shards_are_disjoint_and_cover(splits):
    train = splits[0]
    ids = Dataset(torch.arange(len(train)).float()[:, None], train.y)
    parts = [shard(ids, r, 4) for r in range(4)]
    seen = torch.cat([p.x[:, 0] for p in parts]).long().sort().values
    assert torch.equal(seen, torch.arange(len(train)))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    for bad, message in [((4, 4), r"rank=4: need an integer >= 0 and <= 3 \(0 <= rank < num_shards=4\)"),
                         ((-1, 4), r"rank=-1: need an integer >= 0"), ((0, 0), r"num_shards=0: need an integer >= 1")]:
        with pytest.raises(ValueError, match=message):
            shard(ids, *bad)


def test_batches_are_deterministic_epochs_without_repeats():
    n, b = 23, 5                                   # 4 batches per epoch, 3 examples dropped
    epoch0 = torch.cat([batch_indices(n, b, s, seed=3) for s in range(4)])
    assert len(set(epoch0.tolist())) == 20
    assert torch.equal(batch_indices(n, b, 2, seed=3), batch_indices(n, b, 2, seed=3))
    assert not torch.equal(batch_indices(n, b, 0, seed=3), batch_indices(n, b, 4, seed=3))  # next epoch reshuffles
    data = Dataset(torch.arange(n).float()[:, None], torch.arange(n))
    x, y = batch(data, b, 6, seed=3)
    assert torch.equal(x[:, 0].long(), y) and torch.equal(y, batch_indices(n, b, 6, seed=3))
    with pytest.raises(ValueError, match="batch_size"):
        batch_indices(4, 5, 0, 0)
    with pytest.raises(ValueError, match=r"^batch_indices: batch_size=5: need an integer >= 1 and <= 4 \(at most "
                                         r"the n examples\); step=-1: need an integer >= 0$"):
        batch_indices(4, 5, -1, 0)


def test_mlp_is_seeded_and_flat_views_round_trip(splits):
    rng_before = torch.get_rng_state()
    a, b, c = mlp((64, 128, 10), seed=0), mlp((64, 128, 10), seed=0), mlp((64, 128, 10), seed=1)
    assert torch.equal(torch.get_rng_state(), rng_before)          # the global RNG is untouched
    assert torch.equal(flat_params(a), flat_params(b)) and not torch.equal(flat_params(a), flat_params(c))
    assert flat_params(a).shape == (64 * 128 + 128 + 128 * 10 + 10,)
    load_flat(c, flat_params(a))
    assert torch.equal(flat_params(c), flat_params(a))
    x, y = splits[1]
    torch.nn.functional.cross_entropy(a(x), y).backward()
    assert torch.equal(flat_grads(a), torch.cat([p.grad.reshape(-1) for p in a.parameters()]))
    assert 0.0 <= accuracy(a, splits[1]) <= 0.3                     # untrained: about chance
    with pytest.raises(ValueError, match="9610 parameters"):
        load_flat(a, torch.zeros(3))
    with pytest.raises(ValueError, match="sizes"):
        mlp((64,))
