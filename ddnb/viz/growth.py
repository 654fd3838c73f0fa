"""Published models on log scales: parameters, training tokens and training compute by year.
Takes the plain rows of `ddnb.cost.published.model_table()` (dicts with name, year, params,
tokens, flops, flops_6nd), so it draws without anything else.
Used in `notebooks/01_why_distributed.ipynb`."""
from __future__ import annotations

import matplotlib.pyplot as plt


def _label(ax, name, x, y):
    """The model's name above and to the right of its point, slanted so neighbours don't collide."""
    ax.annotate(name, (x, y), textcoords="offset points", xytext=(2, 5), fontsize=7, rotation=35)


def plot_model_growth(rows: list[dict], axes=None):
    """Three panels against the year, log-scaled: parameters, training tokens (where
    stated), and training compute in FLOPs, stated (filled) and 6·N·D (open). Each point is
    labelled with the model's name. Returns the axes."""
    if not rows:
        raise ValueError("rows is empty: nothing to plot")
    missing = [k for k in ("name", "year", "params") if any(k not in r for r in rows)]
    if missing:
        raise ValueError(f"every row needs name, year and params; missing {missing}")
    if axes is None:
        _, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    panels = [("params", "parameters"), ("tokens", "training tokens"), ("flops", "training compute (FLOPs)")]
    for ax, (key, label) in zip(axes, panels):
        pts = [r for r in rows if r.get(key)]
        ax.plot([r["year"] for r in pts], [r[key] for r in pts], "o", color="C0",
                label="stated" if key == "flops" else None)
        for r in pts:
            _label(ax, r["name"], r["year"], r[key])
        if key == "flops":
            est = [r for r in rows if r.get("flops_6nd")]
            ax.plot([r["year"] for r in est], [r["flops_6nd"] for r in est], "o", mfc="none", color="C1",
                    ms=9, label="6·N·D")
            for r in est:
                if not r.get("flops"):
                    _label(ax, r["name"], r["year"], r["flops_6nd"])
            ax.legend(fontsize=8, loc="upper left")
        ax.set_yscale("log")
        ax.set_xlabel("year")
        ax.set_ylabel(label)
        lo, hi = min(r["year"] for r in rows), max(r["year"] for r in rows)
        ax.set_xlim(lo - 1, hi + 3)
        ax.set_xticks(range(lo - lo % 2, hi + 2, 2 if hi - lo < 16 else 4))
        ax.set_ylim(top=ax.get_ylim()[1] * 30)            # room for the labels above the points
        ax.grid(alpha=0.3, which="both")
    return axes
