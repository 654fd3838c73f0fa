"""Exercises: checkers that run a learner's code on real processes and compare it with the
reference, each answering with one line of success or an AssertionError that names the
rank and element at fault and what that pattern usually means (d2l's exercises, the
LLM-Training-Puzzles' checkers, on a real process group).

    from ddnb.exercises import check_allreduce
    check_allreduce(my_ring_allreduce, world_size=3)

`core` holds the shared runner (deadline, errors) and comparison; each chapter's checkers
live in their own module. Solutions are in `ddnb.exercises.solutions.<chapter module>`.
Every checker takes `exercise="05.1"`; given the learner's stub it prints "Exercise 05.1 not
attempted yet: ..." and the notebook runs on. `solution("05.1")` prints a model answer
from the solved edition (`ddnb.exercises.edition`, which also builds the learner's copies).

Checkers of an exercise that builds a communication pattern refuse the shortcut: while
the learner's function runs on the ranks, `guard` switches off torch.distributed's
collectives and ddnb's own (dist.all_reduce gives check_allreduce the right sum without
the ring the exercise is about) and counts the bytes each rank sends, which must be the
algorithm's: 2(N-1)·S/N per rank for the ring all-reduce (Patarasuk & Yuan 2009), S per
rank for the ring pass, (N-1)·S in all for the broadcast, S per out-neighbour for the
gossip step; top-k may only all-gather, about 2k entries per rank. check_zero1_step
rebuilds the function for every step, so state kept outside `state` is named. Each of
these runs two world sizes, one not a power of two (`worlds`; a notebook's
`world_size=n` is the first of them), with sizes not divisible by N where the exercise
splits a tensor, and compares whole tensors.
Used from `notebooks/00_getting_started.ipynb` to `notebooks/14_precision_compression.ipynb`,
three or more per notebook.
"""
from ddnb.exercises.bucketed import check_bucketed
from ddnb.exercises.collectives import check_allreduce
from ddnb.exercises.compression import check_accumulation_calls, check_powersgd_bytes, check_topk_error_feedback
from ddnb.exercises.context_parallel import check_dropped_tokens, check_merge, check_ulysses_bytes
from ddnb.exercises.core import attempted, checker, close_worlds, compare, passed, run_on_ranks
from ddnb.exercises.data_parallel import check_comm_hook
from ddnb.exercises.data_pipeline import check_bound, check_rank_spans, check_read_bandwidth
from ddnb.exercises.elastic import check_remaining_indices
from ddnb.exercises.edition import solution
from ddnb.exercises.diloco import check_outer_step
from ddnb.exercises.dpsgd import check_dpsgd
from ddnb.exercises.fit import check_fit
from ddnb.exercises.fusion import check_fusion
from ddnb.exercises.partition import check_partition
from ddnb.exercises.decentralized import check_bytes_prediction, check_gossip_step, check_spectral_gap
from ddnb.exercises.first_steps import check_sum_over_ranks
from ddnb.exercises.flops import check_flops_per_token
from ddnb.exercises.p2p import check_broadcast, check_ring_shift
from ddnb.exercises.parameter_server import check_ps_step
from ddnb.exercises.pipeline import check_1f1b
from ddnb.exercises.pipeline_loop import check_pipeline_loop
from ddnb.exercises.predict import check_prediction
from ddnb.exercises.ring_attention import check_ring_attention
from ddnb.exercises.sharding import check_zero1_step
from ddnb.exercises.tasks import check_task_map
from ddnb.exercises.tensor_parallel import check_column_parallel
from ddnb.exercises.zero_bubble import check_zbh1

# Every checker takes `exercise="05.1"` and answers a learner's stub with one line
# ("Exercise 05.1 not attempted yet: ..."), so a learner's copy runs top to bottom.
for _name in [n for n in dir() if n.startswith("check_")]:
    globals()[_name] = checker(globals()[_name])
del _name

__all__ = ["attempted", "check_1f1b", "check_accumulation_calls", "check_allreduce", "check_bound", "check_broadcast",
           "check_bucketed", "check_bytes_prediction", "check_column_parallel", "check_comm_hook", "check_dpsgd",
           "check_dropped_tokens", "check_fit", "check_fusion", "check_partition", "check_pipeline_loop",
           "check_flops_per_token", "check_gossip_step", "check_merge", "check_powersgd_bytes",
           "check_prediction", "check_ps_step", "check_rank_spans", "check_read_bandwidth",
           "check_remaining_indices", "check_outer_step", "check_ring_attention", "check_ring_shift",
           "check_spectral_gap",
           "check_sum_over_ranks",
           "check_task_map", "check_topk_error_feedback", "check_ulysses_bytes", "check_zbh1", "close_worlds",
           "compare",
           "passed", "run_on_ranks", "solution"]
