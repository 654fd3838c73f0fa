"""A widget for Horovod's tensor-fusion knobs: the fusion threshold (HOROVOD_FUSION_THRESHOLD),
the cycle time (HOROVOD_CYCLE_TIME) and fp16 compression. Each change re-runs a few
training steps with Horovod on the cluster's engines under those settings
(`ddnb.bench.horovod_knobs.measure_knobs`) and redraws every run so far: the
measured step time, and the fused all-reduces per step read from Horovod's timeline.

    knobs = HorovodKnobs(cluster)              # measures Horovod's defaults first
    knobs                                      # the menus, the checkbox and the picture
    knobs.measure(fusion_mb=0)                 # the same from code: the run's dict

Horovod 0.28.1 reads the threshold and the cycle only at hvd.init() and crashes when it
starts again in the same process with other values, so a change of either restarts the
engines (fresh processes: seconds, and the engines' namespace is cleared); fp16 alone
does not (the module docstring of `ddnb.data_parallel.horovod_knobs` says what was tried).
Times are real-mode wall-clock on this machine, labelled with its cores;
`ddnb.viz.horovod_knobs.plot_knob_runs` draws the runs from plain dicts, without a cluster.
Taught in `notebooks/07_horovod.ipynb`.
"""
from __future__ import annotations

import ipywidgets as widgets
from IPython.display import display

from ddnb.bench.horovod_knobs import measure_knobs
from ddnb.data_parallel.horovod_knobs import DEFAULTS
from ddnb.viz.horovod_knobs import knob_label, plot_knob_runs
from ddnb.viz.png import figure_png

FUSION = [(f"default ({DEFAULTS['fusion_mb']} MB)", None), ("0: fusion off", 0.0), ("64 KB", 1 / 16), ("1 MB", 1.0)]
CYCLE = [(f"default ({DEFAULTS['cycle_ms']} ms)", None), ("0.2 ms", 0.2), ("5 ms", 5.0), ("20 ms", 20.0)]


class HorovodKnobs:
    """Menus for the fusion threshold and the cycle time, a checkbox for fp16 compression.
    `runs` holds every measured run (dicts of `measure_knobs`), drawn together."""

    def __init__(self, cluster, steps: int = 5, traced: int = 2):
        from ddnb.runtime.conditions import cores

        self.cluster, self.steps, self.traced, self.runs = cluster, steps, traced, []
        self.cores = cores()
        self._quiet = False
        self.fusion = widgets.Dropdown(options=FUSION, value=None, description="fusion")
        self.cycle = widgets.Dropdown(options=CYCLE, value=None, description="cycle")
        self.fp16 = widgets.Checkbox(value=False, description="fp16 compression")
        self.status = widgets.Label()
        self.image = widgets.Image(format="png")
        for w in (self.fusion, self.cycle, self.fp16):
            w.observe(lambda change: self._changed(), names="value")
        self.widget = widgets.VBox([widgets.HBox([self.fusion, self.cycle, self.fp16]), self.status, self.image])
        self.measure()

    def measure(self, fusion_mb: float | None = None, cycle_ms: float | None = None, fp16: bool = False) -> dict:
        """Run these knobs on the cluster (the controls follow), redraw; returns the run."""
        self._quiet = True
        try:
            self.fusion.value, self.cycle.value, self.fp16.value = fusion_mb, cycle_ms, fp16
        finally:
            self._quiet = False
        self.status.value = "measuring (a changed threshold or cycle restarts the engines)..."
        run = measure_knobs(self.cluster, fusion_mb, cycle_ms, fp16, steps=self.steps, traced=self.traced)
        self.runs.append(run)
        self.image.value = figure_png(plot_knob_runs(self.runs, self.cores))
        restart = f"; engines restarted ({run['restart_s']:.0f} s)" if run["restart_s"] else ""
        self.status.value = (f"{knob_label(run)}: {run['step_time'] * 1e3:.1f} ms a step on {self.cores} cores, "
                             f"{run['allreduces_per_step']:g} fused all-reduces per step "
                             f"({run['tensors_per_allreduce']:.1f} of the {run['tensors']} tensors each){restart}")
        return run

    def _changed(self) -> None:
        if self._quiet:
            return
        try:
            self.measure(self.fusion.value, self.cycle.value, self.fp16.value)
        except Exception as e:  # noqa: BLE001 - shown to the learner, not left as a traceback
            self.status.value = f"{type(e).__name__}: {e}"

    def _ipython_display_(self):
        display(self.widget)
