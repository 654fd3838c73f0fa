"""A per-rank timeline of traced events: one row per rank, compute and communication in
different colours, messages drawn as arrows from sender to receiver.
Takes the plain event dicts of `ddnb.trace` (see `ddnb.trace.flatten`).
Taught in `notebooks/03_collectives.ipynb`, and used from there on.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from ddnb.trace import match_messages
from ddnb.viz.memory import fmt_bytes

COLORS = {"compute": "#4c72b0", "send": "#dd8452", "recv": "#55a868", "collective": "#c44e52",
          "wait": "#bbbbbb", "other": "#8172b3"}
# a send and a recv posted together (exchange) overlap in time: sends in the upper half
# of a rank's row, receives in the lower half (the y axis points down)
OFFSETS = {"send": -0.2, "recv": 0.2}


def plot_timeline(events: list[dict], ax=None, title: str = "", unit: str = "ms", arrows: bool = True,
                  label_bytes: bool = False, max_arrows: int = 200):
    """Draw `events` (dicts with rank, kind, name, start, end, peer, nbytes). Returns the Axes."""
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    ranks = sorted({e["rank"] for e in events})
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.6 + 0.55 * max(1, len(ranks))))
    t0 = min((e["start"] for e in events), default=0.0)
    for e in events:
        y = e["rank"] + OFFSETS.get(e["kind"], 0.0)
        h = 0.36 if e["kind"] in OFFSETS else 0.76
        left, width = (e["start"] - t0) * scale, max((e["end"] - e["start"]) * scale, 1e-9)
        ax.barh(y, width, left=left, height=h, color=COLORS.get(e["kind"], "#999999"), edgecolor="none")
        if label_bytes and e["kind"] == "send" and e.get("nbytes"):
            ax.text(left + width / 2, y, fmt_bytes(e["nbytes"]), ha="center", va="center", fontsize=6)
    if arrows:
        for s, r in match_messages(events)[:max_arrows]:
            ax.annotate("", xy=((r["end"] - t0) * scale, r["rank"] + OFFSETS["recv"]),
                        xytext=((s["start"] - t0) * scale, s["rank"] + OFFSETS["send"]),
                        arrowprops=dict(arrowstyle="->", color="#444444", lw=0.6, alpha=0.6))
    ax.set_yticks(ranks)
    ax.set_yticklabels([f"rank {r}" for r in ranks])
    ax.set_ylim(max(ranks, default=0) + 0.6, min(ranks, default=0) - 0.6)
    ax.set_xlabel(f"time ({unit})")
    kinds = [k for k in COLORS if any(e["kind"] == k for e in events)]
    ax.legend(handles=[Patch(color=COLORS[k], label=k) for k in kinds], loc="upper right",
              fontsize=8, ncol=len(kinds) or 1)
    if title:
        ax.set_title(title)
    return ax
