"""`ddnb.collectives.wire.allreduce_bytes_sent`, the measurement exercise 07.3 of notebook 07
checks a prediction against, on a live 4-rank world: the ring sends 2(N-1)/N of the buffer
per rank on average, each rank every chunk but its own (reduce-scatter) and but its right
neighbour's (all-gather), so uneven chunks show per rank; every algorithm's count equals
the messages of its schedule; the caller's tensor is left alone; bad arguments are named
on every rank before any message."""
import pytest
import torch

from ddnb.collectives import ALLREDUCES, allreduce_schedule, chunk_bounds
from ddnb.collectives.schedules import messages_of
from ddnb.collectives.wire import allreduce_bytes_sent
from ddnb.cost import allreduce_bytes_per_rank
from ddnb.runtime.errors import WorkerError


def test_ring_of_the_mlp_gradients_sends_three_quarters_twice(world):
    grads = torch.zeros(9_610)                                      # notebook 07's MLP: 38,440 B
    sent = world(4).run(allreduce_bytes_sent, "ring", grads)
    chunks = [4 * (b - a) for a, b in chunk_bounds(9_610, 4)]     # 9612, 9612, 9608, 9608 bytes
    assert sent == [2 * 38_440 - chunks[r] - chunks[(r + 1) % 4] for r in range(4)] == [57_656, 57_660, 57_664, 57_660]
    assert sum(sent) / 4 == allreduce_bytes_per_rank("ring", 38_440, 4)[0] == 57_660


@pytest.mark.parametrize("algorithm", sorted(ALLREDUCES))
def test_every_algorithm_sends_the_bytes_of_its_schedule(world, algorithm):
    x = torch.ones(3, 333, dtype=torch.float64)                     # 999 elements, 8 bytes each
    sent = world(4).run(allreduce_bytes_sent, algorithm, x)
    schedule = allreduce_schedule(algorithm, 4, 999, element_size=8)
    assert sent == [sum(m.nbytes for m in messages_of(schedule, r)) for r in range(4)]
    assert torch.equal(x, torch.ones(3, 333, dtype=torch.float64))  # the caller's tensor is a copy's source only


def test_bad_arguments_are_named_on_every_rank(world):
    w = world(4)
    with pytest.raises(WorkerError) as e:
        w.run(allreduce_bytes_sent, "rings", torch.zeros(4, dtype=torch.int64))
    msg = str(e.value)
    assert "ranks [0, 1, 2, 3] raised" in msg and "algorithm" in msg and "rings" in msg and "floating-point" in msg
    with pytest.raises(WorkerError) as e:
        w.run(allreduce_bytes_sent, "ring", [1.0, 2.0])
    assert "must be a torch.Tensor, got list" in str(e.value)
    assert w.run(lambda: 1) == [1, 1, 1, 1]
