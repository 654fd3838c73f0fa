"""A widget that re-runs one expert-parallel forward on the cluster
(`ddnb.expert_parallel.load.moe_load`) and draws where the tokens went
(`ddnb.viz.moe.plot_expert_load`), with the dropped assignments and the bytes of the
all-to-alls. Taught in `notebooks/13_sequence_context_expert.ipynb`.

    explorer = MoELoadExplorer(cluster)
    explorer                        # experts, top-k, capacity factor, skew, workers
"""
from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import display

from ddnb.viz.moe import plot_expert_load
from ddnb.viz.png import figure_png


class MoELoadExplorer:
    """Sliders for experts, top-k, capacity factor (or none), router skew and workers; each
    change resizes the cluster when needed, re-runs `moe_load` on every rank and redraws."""

    def __init__(self, cluster, max_workers: int | None = None, tokens: int = 64):
        from ddnb.expert_parallel.load import moe_load

        self.cluster, self.tokens, self._fn = cluster, tokens, moe_load
        self.results: list[dict] = []
        style = dict(continuous_update=False)
        self.experts = widgets.IntSlider(value=8, min=1, max=32, description="experts", **style)
        self.top_k = widgets.IntSlider(value=1, min=1, max=4, description="top-k", **style)
        self.capacity = widgets.FloatSlider(value=1.0, min=0.25, max=4.0, step=0.25, description="capacity", **style)
        self.unlimited = widgets.Checkbox(value=False, description="no capacity limit")
        self.skew = widgets.FloatSlider(value=0.0, min=0.0, max=4.0, step=0.5, description="router skew", **style)
        self.workers = widgets.IntSlider(value=cluster.n, min=1, max=max_workers or cluster.n, description="workers",
                                         **style)
        self.status = widgets.Label()
        self.image = widgets.Image(format="png")
        for w in (self.experts, self.top_k, self.capacity, self.unlimited, self.skew, self.workers):
            w.observe(lambda change: self.run(), names="value")
        self.widget = widgets.VBox([widgets.HBox([self.experts, self.top_k, self.workers]),
                                    widgets.HBox([self.capacity, self.unlimited, self.skew]), self.status, self.image])

    def run(self) -> list[dict] | None:
        """Re-measure with the sliders' values; errors are shown in the widget, not raised."""
        cf = None if self.unlimited.value else float(self.capacity.value)
        from ddnb.expert_parallel.load import check_load_args

        try:
            check_load_args(self.experts.value, self.top_k.value, cf, self.workers.value, self.tokens)
            if self.workers.value != self.cluster.n:
                self.cluster.resize(self.workers.value)
            self.results = self.cluster.run(self._fn, self.experts.value, self.top_k.value, cf, float(self.skew.value),
                                            self.tokens)
        except Exception as e:  # noqa: BLE001 - shown to the learner
            self.status.value = f"{type(e).__name__}: {str(e).splitlines()[0]}"
            return None
        dropped = sum(r["dropped"] for r in self.results)
        assigned = sum(r["assigned"] for r in self.results)
        sent = sum(r["sent_bytes"] for r in self.results)
        self.status.value = (f"{self.cluster.n} ranks, {self.experts.value} experts: dropped {dropped} of {assigned} "
                             f"assignments ({dropped / assigned:.0%}); all-to-all bytes sent {sent}")
        fig, ax = plt.subplots(figsize=(6.5, 3))
        plot_expert_load(self.results, title=f"top-{self.top_k.value}, capacity factor {cf}", ax=ax)
        self.image.value = figure_png(fig)
        return self.results

    def _ipython_display_(self):
        display(self.widget)
