"""Solution of `ddnb.exercises.pipeline` (`notebooks/09_pipeline_parallelism.ipynb`)."""
from __future__ import annotations


def one_f_one_b(stages: int, microbatches: int) -> list[list[str]]:
    """1F1B (Narayanan et al. 2019, PipeDream-Flush): stage s warms up with stages - s - 1
    forwards, then alternates one forward and one backward, then drains the backwards."""
    schedule = []
    for s in range(stages):
        warmup = min(stages - s - 1, microbatches)
        acts = [f"F{j}" for j in range(warmup)]
        f, b = warmup, 0
        while f < microbatches:
            acts += [f"F{f}", f"B{b}"]
            f, b = f + 1, b + 1
        acts += [f"B{j}" for j in range(b, microbatches)]
        schedule.append(acts)
    return schedule
