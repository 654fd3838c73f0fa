"""A widget that chooses where to cut a model's layers into stages, re-runs the naive
model-parallel step on the cluster with that partition, and shows per-rank compute time,
idle fraction and memory.

    explorer = PartitionExplorer(cluster, GPTConfig())   # a stage-count slider, a menu of cuts
    explorer                                             # ... and the picture
    explorer.show([(0, 2), (2, 6)])                      # one partition from code: the result dict

Each choice runs `ddnb.pipeline_parallel.naive_training.train_split` on the first p ranks
of the cluster (a group of their own), a few steps with the last ones traced, and reads the
median step (`step_summary`). The status line says whether the first step's gradients equal
the unsplit model's in this process (`train_single`): whatever the cut, they must. The
picture is `ddnb.viz.partition.plot_partition`, which takes the plain result dict. Whatever the partition, the
mean idle fraction stays near (p - 1)/p: a cut moves work between ranks, never overlaps it
(Huang et al. 2019, GPipe, Sec. 2.2). Taught in `notebooks/08_model_parallelism.ipynb`.
"""
from __future__ import annotations

import ipywidgets as widgets
from IPython.display import display

from ddnb._checks import Checks
from ddnb.pipeline_parallel.naive import check_bounds
from ddnb.pipeline_parallel.naive_training import (all_partitions, grads_match, median_step, step_summary,
                                                   train_single, train_split)
from ddnb.viz.partition import plot_partition
from ddnb.viz.png import figure_png


def measure_partition(cluster, cfg, bounds, steps: int = 6, trace_last: int = 3, batch: int = 32) -> dict:
    """Train `steps` steps of the layer split `bounds` on the first len(bounds) ranks of
    `cluster`; returns {"bounds", "step" (s, median traced step), "compute" (s per rank),
    "idle" (fraction per rank), "memory" (bytes dict per rank), "split" (train_split's
    dicts, for `grads_match`)}."""
    with Checks("measure_partition") as check:
        check.integer("steps", steps, min=1)
        check.integer("trace_last", trace_last, min=1, max=steps)
        check.rule(isinstance(bounds, (list, tuple)) and 1 <= len(bounds) <= cluster.n,
                   f"bounds {bounds!r}: 1 to {cluster.n} stages (the cluster's workers)")
    check_bounds(bounds, cfg.n_layers + 2, len(bounds))   # before any rank starts: gpt has n_layers + 2 layers
    split = [r for r in cluster.run(train_split, cfg, "equal", steps, batch=batch, trace_last=trace_last,
                                    bounds=bounds) if r is not None]
    summary = step_summary(median_step(split), len(bounds))
    return dict(summary, bounds=[tuple(b) for b in bounds], memory=[r["memory"] for r in split], split=split)


class PartitionExplorer:
    """A slider for the number of stages p (2 .. min(cluster.n, layers)) and a menu of every
    contiguous cut of the model's layers into p stages; each choice re-runs on the cluster."""

    def __init__(self, cluster, cfg, stages: int | None = None, steps: int = 6):
        from ddnb.runtime.conditions import cores

        n_layers = cfg.n_layers + 2             # Embedding, the Blocks, Head
        top = min(cluster.n, n_layers)
        stages = top if stages is None else stages
        with Checks("PartitionExplorer") as check:
            check.rule(top >= 2, f"the cluster has {cluster.n} worker(s); a split needs 2 or more")
            check.integer("stages", stages, min=2, max=max(2, top))
            check.integer("steps", steps, min=2)
        self.cluster, self.cfg, self.steps, self.n_layers = cluster, cfg, steps, n_layers
        self.cores = None if getattr(cluster, "emulate", None) is not None else cores()
        self.reference = train_single(cfg, steps=1)          # first-step gradients and memory of one process
        self.results: dict = {}
        self.stages = widgets.IntSlider(value=stages, min=2, max=top, description="stages p",
                                        continuous_update=False)
        self.menu = widgets.Dropdown(options=self._options(stages), description="partition",
                                     layout=widgets.Layout(width="420px"))
        self.status = widgets.Label()
        self.image = widgets.Image(format="png")
        self.stages.observe(lambda change: self._new_stages(change["new"]), names="value")
        self.menu.observe(lambda change: self.redraw(), names="value")
        self.widget = widgets.VBox([widgets.HBox([self.stages, self.menu]), self.status, self.image])
        self.redraw()

    def _options(self, p: int) -> list:
        return [(" ".join(f"[{a},{b})" for a, b in bounds), tuple(bounds)) for bounds in all_partitions(self.n_layers, p)]

    def _new_stages(self, p: int) -> None:
        self.menu.options = self._options(p)        # selects the first cut, which redraws

    def show(self, bounds) -> dict:
        """Run one partition, draw it, and keep its result in `self.results[bounds]` (with
        "grads_equal": the first step's gradients equal one process's, 1e-5)."""
        bounds = tuple(tuple(b) for b in bounds)
        result = measure_partition(self.cluster, self.cfg, list(bounds), steps=self.steps)
        result["grads_equal"] = grads_match(result.pop("split"), self.reference)
        self.results[bounds] = result
        self.image.value = figure_png(plot_partition(result, self.reference["memory"], self.cores))
        p = len(bounds)
        self.status.value = (f"{p} stages: mean idle {sum(result['idle']) / p:.0%} ((p-1)/p = {(p - 1) / p:.0%}); "
                             f"gradients equal to one process: {result['grads_equal']}")
        return result

    def redraw(self) -> None:
        """Re-run the menu's partition; errors are shown in the widget, not raised."""
        if self.menu.value is None:                 # between two option lists
            return
        self.status.value = f"running {self.menu.label} ..."
        try:
            self.show(self.menu.value)
        except Exception as e:  # noqa: BLE001 - shown to the learner
            self.status.value = f"{type(e).__name__}: {e}"

    def _ipython_display_(self):
        display(self.widget)
