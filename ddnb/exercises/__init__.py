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
from ddnb.exercises.compression import check_accumulation_calls, check_powersgd_bytes, check_topk_error_feedback
from ddnb.exercises.core import close_worlds, compare, passed, run_on_ranks

__all__ = ["check_allreduce", "close_worlds", "compare", "passed", "run_on_ranks"]
