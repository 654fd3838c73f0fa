"""Cost models: what a distributed step should take, before it is measured.

`alpha_beta`: the alpha-beta-gamma model of all-reduce (Thakur et al. 2005) and the
measurements that give its parameters (ping-pong, sendrecv, a local add).
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

__all__ = ["ALGORITHMS", "allreduce_bytes_per_rank", "allreduce_time", "fit_alpha_beta",
           "measure_gamma", "pingpong", "sendrecv"]
