"""A pipeline schedule you edit as text: one line per rank ("F0 F1 B0 W0 ..."), checked by
the static checker at every edit and redrawn on paper. No cluster needed.

    editor = ScheduleEditor(zbh1_schedule(4, 8))     # or a text, e.g. "F0 B0 W0\\nF0 B0 W0"
    editor                                           # the text box, the verdict, the picture
    editor.text.value = "..."                        # what typing does: checked, then drawn

The verdict is `ddnb.pipeline_parallel.validate_schedule`'s: its error, naming the rank
and the first action at fault (or every blocked rank of a deadlock), or its report: the
unit-cost bubble (F = B = W = 1, Qi et al. 2024, "Zero Bubble Pipeline Parallelism",
Sec. 2.1), the step's length and each rank's peak of micro-batches in flight. The picture
is `plot_schedule` (W in its own colour). A placement toggle reads the same text as looped
(one chunk per rank, or interleaved) or as a V (ZB-V, DualPipeV: rank r holds stages r and
2p-1-r). Taught in `notebooks/09b_zero_bubble.ipynb`.
"""
from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import display

from ddnb.pipeline_parallel.actions import num_chunks, parse_schedule
from ddnb.pipeline_parallel.check import validate_schedule
from ddnb.viz.pipeline import plot_schedule
from ddnb.viz.png import figure_png


def schedule_text(schedule) -> str:
    """A schedule as the editor's text: one line per rank, actions as they print."""
    return "\n".join(" ".join(map(repr, acts)) for acts in schedule)


def microbatches_of(schedule) -> int:
    """The micro-batch count a schedule's text implies: 1 + the largest micro-batch named."""
    return 1 + max((a.microbatch for acts in schedule for a in acts), default=0)


class ScheduleEditor:
    """A text box (one rank per line), the micro-batch count and the placement; every edit
    re-checks the schedule with `validate_schedule` and redraws it with `plot_schedule`.
    `status` holds the verdict (the checker's error, or its report) and `report` the
    `ScheduleReport` (None while the text does not pass)."""

    def __init__(self, schedule="F0 B0\nF0 B0", microbatches: int | None = None, placement: str | None = None):
        text = schedule if isinstance(schedule, str) else schedule_text(schedule)
        if placement is None:
            given = getattr(schedule, "placement", None)
            placement = "v" if given and len(given[0]) == 2 and given[0] == [0, 2 * len(given) - 1] else "looped"
        self.text = widgets.Textarea(value=text, description="schedule", continuous_update=False,
                                     layout=widgets.Layout(width="98%", height=f"{2 + 1.6 * text.count(chr(10))}em"))
        self.m = widgets.BoundedIntText(value=microbatches or microbatches_of(parse_schedule(text)), min=1, max=256,
                                        description="micro-batches m", style={"description_width": "initial"})
        self.placement = widgets.ToggleButtons(options=[("looped", "looped"), ("V", "v")], value=placement,
                                               description="placement")
        self.status = widgets.Label()
        self.image = widgets.Image(format="png")
        self.report = None
        for w in (self.text, self.m, self.placement):
            w.observe(lambda change: self.redraw(), names="value")
        self.widget = widgets.VBox([self.text, widgets.HBox([self.m, self.placement]), self.status, self.image])
        self.redraw()

    def schedule(self):
        """The text read as a `Schedule` with the chosen placement (ValueError if it is not one)."""
        return parse_schedule(self.text.value, self.placement.value)

    def check(self) -> str:
        """The verdict on the current text, in one line; sets `report`."""
        self.report = None
        try:
            schedule = self.schedule()
            self.report = validate_schedule(schedule, self.m.value)
        except ValueError as e:
            return f"✗ {e}"
        r = self.report
        return (f"✓ valid for m={self.m.value} on {len(schedule)} ranks, {num_chunks(schedule)} chunk(s) each: "
                f"bubble {r.bubble:.3f} (F = B = W = 1), step {r.step_time:g}, peak in flight per rank "
                f"{r.peak_in_flight}")

    def redraw(self) -> None:
        self.status.value = self.check()
        if self.report is None:
            self.image.value = b""
            return
        schedule = self.schedule()
        fig, ax = plt.subplots(figsize=(9, 0.9 + 0.5 * len(schedule)))
        plot_schedule(schedule, ax=ax)
        fig.tight_layout()
        self.image.value = figure_png(fig)

    def _ipython_display_(self):
        display(self.widget)
