"""Step-by-step states of the all-reduce algorithms, for the animations of notebook 05,
computed from their schedules (`ddnb.collectives.schedules`), the same data a test
checks against the messages the real algorithms send.

The buffer of every rank is cut into N chunks (the schedule of a tensor of N elements:
chunk c is element c, the ring's chunk c). A state records, for each rank r and chunk c,
the set of ranks whose contributions rank r's copy of chunk c already holds: {r} at the
start, all N ranks at the end. Each step lists the messages sent in it (src, dst,
chunks) and the state after it: a reducing message adds the sender's set to the
receiver's, a copying one replaces it. Algorithms: naive (every rank sends to rank 0,
which sends the result back), binomial tree (reduce to rank 0, then broadcast), ring
(Patarasuk & Yuan 2009: N−1 reduce-scatter steps, then N−1 all-gather steps) and
halving-doubling (Rabenseifner; Thakur, Rabenseifner & Gropp 2005).
Taught in `notebooks/05_allreduce.ipynb`.
"""
from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import display

from ddnb._checks import Checks
from ddnb.collectives.schedules import SCHEDULES, allreduce_schedule
from ddnb.viz.png import figure_png

ALGORITHMS = tuple(SCHEDULES)


def _apply(state, messages):
    """The state after one step; every message reads the state from before the step."""
    new = [row[:] for row in state]
    for m in messages:
        for c in range(m.start, m.stop):
            new[m.dst][c] = (state[m.dst][c] | state[m.src][c]) if m.reduce else state[m.src][c]
    return new


def allreduce_steps(algorithm: str, n: int) -> list[dict]:
    """[{"phase", "messages": [(src, dst, chunks)], "state"}] with the initial state first:
    the schedule `allreduce_schedule(algorithm, n, numel=n)`, one chunk per element."""
    with Checks("allreduce_steps") as check:
        check.choice("algorithm", algorithm, ALGORITHMS)
        check.integer("n", n, min=1)
    state = [[frozenset([r]) for _ in range(n)] for r in range(n)]
    steps = [{"phase": "start", "messages": [], "state": state}]
    for step in allreduce_schedule(algorithm, n, numel=n):
        state = _apply(state, step)
        steps.append({"phase": step[0].phase if step else "idle", "state": state,
                      "messages": [(m.src, m.dst, list(range(m.start, m.stop))) for m in step]})
    return steps


def draw_step(step: dict, n: int, ax=None, title: str = ""):
    """One state: rows are ranks, columns chunks; the shade and the number are how many
    ranks' contributions that copy of the chunk holds (N = fully reduced)."""
    if ax is None:
        _, ax = plt.subplots(figsize=(1.2 + 0.55 * n, 0.6 + 0.5 * n))
    cmap = plt.get_cmap("Blues")
    for r, row in enumerate(step["state"]):
        for c, held in enumerate(row):
            frac = len(held) / n
            ax.add_patch(plt.Rectangle((c, r), 1, 1, color=cmap(0.15 + 0.75 * frac), ec="white"))
            ax.text(c + 0.5, r + 0.5, str(len(held)), ha="center", va="center", fontsize=8,
                    color="white" if frac > 0.6 else "black")
    for src, dst, chunks in step["messages"]:
        ax.annotate("", xy=(n + 0.3, dst + 0.5), xytext=(n + 0.3, src + 0.5),
                    arrowprops=dict(arrowstyle="->", color="#dd8452",
                                    connectionstyle=f"arc3,rad={0.4 if dst > src else -0.4}"))
    ax.set_xlim(0, n + 1)
    ax.set_ylim(n, 0)
    ax.set_xticks([c + 0.5 for c in range(n)])
    ax.set_xticklabels([f"c{c}" for c in range(n)], fontsize=7)
    ax.set_yticks([r + 0.5 for r in range(n)])
    ax.set_yticklabels([f"rank {r}" for r in range(n)], fontsize=7)
    ax.set_aspect("equal")
    ax.set_title(title or step["phase"], fontsize=9)
    for spine in ax.spines.values():
        spine.set_visible(False)
    return ax


def plot_allreduce_steps(algorithm: str, n: int, max_cols: int = 7):
    """Every step of one algorithm side by side (the static version of the animation)."""
    steps = allreduce_steps(algorithm, n)
    cols = min(max_cols, len(steps))
    rows = -(-len(steps) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(cols * (0.5 + 0.45 * n), rows * (0.8 + 0.45 * n)), squeeze=False)
    for i, ax in enumerate(axes.flat):
        if i < len(steps):
            draw_step(steps[i], n, ax, title=f"{i}: {steps[i]['phase']}")
        else:
            ax.axis("off")
    fig.suptitle(f"{algorithm} all-reduce, {n} ranks: {len(steps) - 1} steps")
    fig.tight_layout()
    return fig


class AllreduceAnimation:
    """Play button and step slider over `allreduce_steps(algorithm, n)`, with a choice of
    algorithm and of the number of ranks."""

    def __init__(self, algorithm: str = "ring", n: int = 4, max_n: int = 8):
        self.algorithm = widgets.Dropdown(options=list(ALGORITHMS), value=algorithm, description="algorithm")
        self.n = widgets.IntSlider(value=n, min=2, max=max_n, description="ranks")
        self.play = widgets.Play(interval=900, min=0, max=1, step=1, description="play")
        self.step = widgets.IntSlider(min=0, max=1, description="step")
        widgets.jslink((self.play, "value"), (self.step, "value"))
        self.image = widgets.Image(format="png")
        self.algorithm.observe(lambda _: self._reset(), names="value")
        self.n.observe(lambda _: self._reset(), names="value")
        self.step.observe(lambda _: self.redraw(), names="value")
        self.widget = widgets.VBox([widgets.HBox([self.algorithm, self.n]),
                                    widgets.HBox([self.play, self.step]), self.image])
        self._reset()

    def _reset(self):
        self.steps = allreduce_steps(self.algorithm.value, self.n.value)
        last = len(self.steps) - 1
        self.step.max = self.play.max = max(last, 1)
        self.step.value = min(self.step.value, last)
        self.redraw()

    def redraw(self):
        i = min(self.step.value, len(self.steps) - 1)
        ax = draw_step(self.steps[i], self.n.value,
                       title=f"{self.algorithm.value}: step {i}/{len(self.steps) - 1} ({self.steps[i]['phase']})")
        self.image.value = figure_png(ax.figure)

    def _ipython_display_(self):
        display(self.widget)
