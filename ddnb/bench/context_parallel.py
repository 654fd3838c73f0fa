"""The context-parallel schemes timed side by side on an emulated cluster: every rank of a
`ddnb.testing.World` runs `ddnb.context_parallel.timing.time_attention` (one attention
forward, then forward + backward, per scheme and sequence length), and the rows say which
scheme hides its messages behind compute (Liu et al. 2023, Sec. 3).

    rows, summary = emulated_comparison(get_profile("ib").with_(slowdown=200), workers=4)

Taught in `notebooks/13_sequence_context_expert.ipynb`.
"""
from __future__ import annotations

from ddnb.context_parallel.timing import SCHEMES, time_attention


def emulated_comparison(profile, workers: int = 4, seq_lens=(1024, 4096), heads: int = 4, head_dim: int = 64) -> list:
    """Rows {seq_len, pass ("forward" / "forward+backward"), scheme, time} measured on a
    `ddnb.testing.World` of `workers` emulated ranks of `profile`, and the run's overrun
    summary: (rows, summary)."""
    from ddnb.emulate import summary
    from ddnb.testing import World

    rows = []
    with World(workers, emulate=profile) as world:
        for s in seq_lens:
            for backward in (False, True):
                for scheme in SCHEMES:
                    t = world.run(time_attention, scheme, seq_len=s, heads=heads, head_dim=head_dim,
                                  backward=backward)[0]
                    rows.append({"seq_len": s, "pass": "forward+backward" if backward else "forward",
                                 "scheme": scheme, "time": t})
        return rows, summary(world.emulation_reports())
