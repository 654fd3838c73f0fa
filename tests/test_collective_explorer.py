"""CollectiveExplorer (notebook 03): the collectives run on the first k ranks of a world of
4, in a group of their own, give every rank the buffers the definitions say; the widget
and its headless picture build."""
import matplotlib

matplotlib.use("Agg")

import pytest

from ddnb.collectives.demo import COLLECTIVES, expected_buffers, on_first_ranks
from ddnb.viz.buffers import plot_collective
from ddnb.viz.widgets.collective_explorer import CollectiveExplorer, collective_buffers


class WorldAsCluster:
    """What the explorer uses of a ddnb.Cluster (n, run), on a ddnb.testing.World."""

    def __init__(self, world):
        self.world, self.n = world, world.n

    def run(self, fn, *args, **kwargs):
        return self.world.run(fn, *args, **kwargs)


def every_collective_on_first_ranks():
    return {(name, k, per_rank): on_first_ranks(name, k, per_rank)
            for name in COLLECTIVES for k in (2, 3, 4) for per_rank in (1, 2)}


def test_every_collective_on_2_3_4_ranks_equals_its_definition(world):
    per_rank_results = world(4).run(every_collective_on_first_ranks)
    for (name, k, per_rank) in per_rank_results[0]:
        got = [per_rank_results[r][(name, k, per_rank)] for r in range(4)]
        assert got[k:] == [None] * (4 - k), (name, k)          # ranks outside the group took no part
        before, after = [b for b, _ in got[:k]], [a for _, a in got[:k]]
        assert (before, after) == expected_buffers(name, k, per_rank), (name, k, per_rank)


def test_definitions_by_hand():
    assert expected_buffers("all_reduce", 4, 2)[1] == [[64.0, 68.0]] * 4      # 1+11+21+31, 2+12+22+32
    assert expected_buffers("all_to_all", 2, 1) == ([[1.0, 2.0], [11.0, 12.0]], [[1.0, 11.0], [2.0, 12.0]])
    assert expected_buffers("reduce_scatter", 3, 1)[1] == [[33.0], [36.0], [39.0]]
    assert expected_buffers("scatter", 3, 1) == ([[1.0, 2.0, 3.0], None, None], [[1.0], [2.0], [3.0]])
    assert expected_buffers("gather", 2, 1)[1] == [[1.0, 11.0], None]


def test_bad_input_named_on_every_rank_before_any_group(world):
    w = world(4)
    with pytest.raises(Exception, match="unknown collective 'allreduce'"):
        w.run(on_first_ranks, "allreduce", 2)
    assert w.run(on_first_ranks, "broadcast", 2) == [([1.0], [1.0]), ([11.0], [1.0]), None, None]   # still usable
    with pytest.raises(ValueError) as e:
        collective_buffers(WorldAsCluster(w), "reduce", 5, per_rank=0)
    assert "world_size=5" in str(e.value) and "per_rank=0" in str(e.value)


def test_widget_runs_on_the_world_and_redraws(world):
    explorer = CollectiveExplorer(WorldAsCluster(world(4)), "all_gather", world_size=3)
    assert explorer.results == {("all_gather", 3, 1): True} and explorer.image.value[:4] == b"\x89PNG"
    explorer.menu.value = "all_to_all"
    explorer.size.value = 2
    assert explorer.results[("all_to_all", 2, 1)] is True and "True" in explorer.status.value
    with pytest.raises(ValueError, match="world_size=1"):
        CollectiveExplorer(WorldAsCluster(world(4)), world_size=1)


def test_headless_picture_draws_empty_rows():
    before, after = expected_buffers("reduce", 3, 2)
    fig = plot_collective("reduce", before, after)
    assert fig.axes[0].get_title() == "before" and len(fig.axes[1].get_yticklabels()) == 3
