"""Cost models: what a distributed step should take, before it is measured.

`alpha_beta`: the alpha-beta-gamma model of all-reduce (Thakur et al. 2005) and the
measurements that give its parameters (ping-pong, sendrecv, a local add).
`pipeline`: the bubble (p-1)/(m+p-1), step time and activation memory of pipeline
schedules (Huang et al. 2019; Narayanan et al. 2021).
`model_parallel`: bytes a naive layer split sends per step, and its per-rank idle time.
"""
from ddnb.cost.alpha_beta import (
    ALGORITHMS,
    allreduce_bytes_per_rank,
    allreduce_time,
    fit_alpha_beta,
    measure_gamma,
    pingpong,
    sendrecv,
)
from ddnb.cost.model_parallel import boundary_bytes, model_parallel_bytes, sequential_idle_fractions
from ddnb.cost.pipeline import (interleaved_bubble_fraction, model_parallel_idle_fraction, peak_microbatches_in_flight,
                                pipeline_activation_bytes, pipeline_bubble_fraction, pipeline_step_time)

__all__ = ["ALGORITHMS", "allreduce_bytes_per_rank", "allreduce_time", "fit_alpha_beta",
           "measure_gamma", "pingpong", "sendrecv"]
__all__ += ["interleaved_bubble_fraction", "model_parallel_idle_fraction", "peak_microbatches_in_flight",
            "pipeline_activation_bytes", "pipeline_bubble_fraction", "pipeline_step_time"]
__all__ += ["boundary_bytes", "model_parallel_bytes", "sequential_idle_fractions"]
