"""Where the tokens of one expert-parallel forward went (`ddnb.expert_parallel.load.moe_load`'s
per-rank dicts): tokens received by each expert, grouped by the rank that holds it, against
the capacity. The widget that re-runs the forward on the cluster is
`ddnb.viz.widgets.moe.MoELoadExplorer`. Taught in `notebooks/13_sequence_context_expert.ipynb`.
"""
from __future__ import annotations

import matplotlib.pyplot as plt


def plot_expert_load(results: list[dict], title: str = "", ax=None):
    """Bars of tokens received per expert (colour: the rank holding it), a dashed line at
    the capacity (summed over the ranks' groups). `results`: `moe_load`'s, one per rank."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 3))
    per = len(results[0]["received"])
    for r in results:
        xs = [r["rank"] * per + j for j in range(per)]
        ax.bar(xs, r["received"], color=f"C{r['rank'] % 10}", label=f"rank {r['rank']}")
    cap = results[0]["capacity"]
    if cap is not None:
        ax.axhline(cap * len(results), color="k", ls="--", lw=1, label="capacity x ranks")
    ax.set_xlabel("expert")
    ax.set_ylabel("tokens received")
    ax.set_title(title)
    ax.legend(fontsize=7, ncol=2)
    return ax
