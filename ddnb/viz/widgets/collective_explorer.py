"""A widget that runs one of torch.distributed's collectives on the first k workers of a
`ddnb.Cluster` and draws every rank's buffer before and after it.

    explorer = CollectiveExplorer(cluster)          # a menu of collectives, a world-size slider
    explorer                                        # ... and the picture
    explorer.show("all_reduce", 3)                  # the same from code: returns (before, after)

Each change re-runs the collective on the engines (`ddnb.collectives.demo.on_first_ranks`:
the first k ranks in a group of their own, through `dist.new_group`), not a replay, and
says whether what came back equals the collective's definition computed in this process
(`ddnb.collectives.demo.expected_buffers`). The picture is `ddnb.viz.buffers.plot_collective`,
which takes plain lists and draws without a cluster. Taught in `notebooks/03_collectives.ipynb`.
"""
from __future__ import annotations

import ipywidgets as widgets
from IPython.display import display

from ddnb._checks import Checks
from ddnb.collectives.demo import COLLECTIVES, expected_buffers, on_first_ranks
from ddnb.viz.buffers import plot_collective
from ddnb.viz.png import figure_png


def collective_buffers(cluster, name: str, world_size: int, per_rank: int = 1) -> tuple[list, list]:
    """Run `name` on ranks 0 .. world_size - 1 of `cluster` (the others only help form the
    group); returns (before, after) of those ranks, one list per rank."""
    with Checks("collective_buffers") as check:
        check.choice("name", name, COLLECTIVES)
        check.integer("world_size", world_size, min=1, max=cluster.n)
        check.integer("per_rank", per_rank, min=1, max=8, why=" (elements drawn per rank and piece)")
    out = cluster.run(on_first_ranks, name, world_size, per_rank)[:world_size]
    return [b for b, _ in out], [a for _, a in out]


class CollectiveExplorer:
    """A menu of the eight collectives, a slider for the world size (2 .. cluster.n) and
    one for the elements per rank (and per piece, for scatter, reduce-scatter and
    all-to-all). Each change runs the collective on the cluster and redraws."""

    def __init__(self, cluster, name: str = "all_reduce", world_size: int | None = None, per_rank: int = 1):
        world_size = cluster.n if world_size is None else world_size
        with Checks("CollectiveExplorer") as check:
            check.choice("name", name, COLLECTIVES)
            check.rule(cluster.n >= 2, f"the cluster has {cluster.n} worker(s); a collective needs 2 or more")
            check.integer("world_size", world_size, min=2, max=max(2, cluster.n))
            check.integer("per_rank", per_rank, min=1, max=4)
        self.cluster, self.results = cluster, {}
        self.menu = widgets.Dropdown(options=list(COLLECTIVES), value=name, description="collective")
        self.size = widgets.IntSlider(value=world_size, min=2, max=cluster.n, description="world size",
                                      continuous_update=False)
        self.per_rank = widgets.IntSlider(value=per_rank, min=1, max=4, description="per rank",
                                          continuous_update=False)
        self.status = widgets.Label()
        self.image = widgets.Image(format="png")
        for w in (self.menu, self.size, self.per_rank):
            w.observe(lambda change: self.redraw(), names="value")
        self.widget = widgets.VBox([widgets.HBox([self.menu, self.size, self.per_rank]), self.status, self.image])
        self.redraw()

    def show(self, name: str, world_size: int, per_rank: int = 1) -> tuple[list, list]:
        """Run and draw one collective; returns (before, after), and keeps whether they
        equal the definition in `self.results[(name, world_size, per_rank)]`."""
        before, after = collective_buffers(self.cluster, name, world_size, per_rank)
        ok = (before, after) == expected_buffers(name, world_size, per_rank)
        self.results[(name, world_size, per_rank)] = ok
        self.image.value = figure_png(plot_collective(name, before, after))
        self.status.value = (f"{name} ran on ranks 0-{world_size - 1} of the cluster; equal to its definition "
                             f"computed in one process: {ok}")
        return before, after

    def redraw(self) -> None:
        """Re-run with the widget's values. Errors are shown in the widget, not raised (a
        slider must not leave a traceback in the notebook)."""
        self.status.value = f"running {self.menu.value} on {self.size.value} ranks..."
        try:
            self.show(self.menu.value, self.size.value, self.per_rank.value)
        except Exception as e:  # noqa: BLE001 - shown to the learner
            self.status.value = f"{type(e).__name__}: {e}"

    def _ipython_display_(self):
        display(self.widget)
