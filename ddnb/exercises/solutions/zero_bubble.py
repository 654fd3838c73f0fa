"""Solution of `ddnb.exercises.zero_bubble` (`notebooks/09b_zero_bubble.ipynb`)."""
from __future__ import annotations


def my_zbh1(stages: int, microbatches: int) -> list[list[str]]:
    """ZB-H1 from 1F1B (Qi et al. 2024, Sec. 2.1): 1F1B's F and B order on every rank, each
    backward split into B and W, and rank r's W(j) run r micro-batches after its B(j),
    the W's still owed at the end run last."""
    schedule = []
    for r in range(stages):
        warmup = min(stages - r - 1, microbatches)
        acts = [f"F{j}" for j in range(warmup)]
        f, b, w = warmup, 0, 0
        while b < microbatches:
            if f < microbatches:
                acts.append(f"F{f}")
                f += 1
            acts.append(f"B{b}")
            b += 1
            if b > r:                      # W lags B by r micro-batches
                acts.append(f"W{w}")
                w += 1
        schedule.append(acts + [f"W{j}" for j in range(w, microbatches)])
    return schedule
