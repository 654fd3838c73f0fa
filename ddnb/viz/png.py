"""A matplotlib figure as PNG bytes, the image every ddnb widget redraws into an
ipywidgets.Image (one helper for all of them). Used from
`notebooks/00_getting_started.ipynb` on.
"""
from __future__ import annotations

import io

import matplotlib.pyplot as plt


def figure_png(fig) -> bytes:
    """The figure as PNG bytes (for an ipywidgets.Image), closed afterwards."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()
