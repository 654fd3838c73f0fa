"""The MoE load measurement and its widget: tokens received, drops and bytes come from a
real expert-parallel forward on the ranks; bad settings are named, in the widget too."""
import pytest

from ddnb.expert_parallel.load import check_load_args, moe_load


class WorldCluster:
    """What the widget needs of a Cluster (n, run, resize), on a ddnb.testing World."""

    def __init__(self, world):
        self.world, self.n = world, world.n

    def run(self, fn, *args):
        return self.world.run(fn, *args)

    def resize(self, n):
        raise AssertionError("not resized in this test")


def test_loads_add_up_and_the_skew_drops_more(world):
    even = world(4).run(moe_load, 8, 2, 1.0, 0.0)
    skewed = world(4).run(moe_load, 8, 2, 1.0, 3.0)
    for res in (even, skewed):
        received = sum(sum(r["received"]) for r in res)
        assert received + sum(r["dropped"] for r in res) == sum(r["assigned"] for r in res) == 4 * 2 * 64
        cap = res[0]["capacity"]
        assert cap == 16 and all(max(r["received"]) <= 4 * cap for r in res)   # each rank's group fills <= cap
        assert all(r["sent_bytes"] > 0 for r in res)
    assert sum(r["dropped"] for r in skewed) > sum(r["dropped"] for r in even)
    unlimited = world(4).run(moe_load, 8, 2, None, 3.0)
    assert sum(r["dropped"] for r in unlimited) == 0


def test_bad_settings_are_named_together():
    with pytest.raises(ValueError, match=r"top_k=10.*capacity_factor=-1.*num_experts=9 is not divisible by the 4 ranks"):
        check_load_args(9, 10, -1, 4, 64)


def test_widget_reruns_and_reports_errors(world):
    from ddnb.viz.widgets.moe import MoELoadExplorer

    explorer = MoELoadExplorer(WorldCluster(world(4)))
    assert explorer.run() and "dropped" in explorer.status.value and explorer.image.value[:4] == b"\x89PNG"
    explorer.experts.value = 6                        # not divisible by 4 ranks: shown, not raised
    assert "not divisible by the 4 ranks" in explorer.status.value
