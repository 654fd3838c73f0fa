"""Exercises: checkers that run a learner's code on real processes and compare it with the
reference, each answering with one line of success or an AssertionError that names the
rank and element at fault and what that pattern usually means (d2l's exercises, the
LLM-Training-Puzzles' checkers, on a real process group).

    from ddnb.exercises import check_allreduce
    check_allreduce(my_ring_allreduce, world_size=3)

`core` holds the shared runner (deadline, errors) and comparison; each chapter's checkers
live in their own module. Solutions are in `ddnb.exercises.solutions.<chapter module>`.
"""
from ddnb.exercises.collectives import check_allreduce
from ddnb.exercises.core import close_worlds, compare, passed, run_on_ranks
from ddnb.exercises.data_parallel import check_comm_hook
from ddnb.exercises.first_steps import check_sum_over_ranks
from ddnb.exercises.flops import check_flops_per_token
from ddnb.exercises.p2p import check_broadcast, check_ring_shift
from ddnb.exercises.parameter_server import check_ps_step
from ddnb.exercises.pipeline import check_1f1b
from ddnb.exercises.predict import check_prediction
from ddnb.exercises.tasks import check_task_map
from ddnb.exercises.tensor_parallel import check_column_parallel

__all__ = ["check_1f1b", "check_allreduce", "check_column_parallel", "check_comm_hook", "check_prediction",
           "close_worlds", "compare", "passed", "run_on_ranks"]
__all__ += ["check_broadcast", "check_flops_per_token", "check_ps_step", "check_ring_shift",  # chapters 00-04
            "check_sum_over_ranks", "check_task_map"]
