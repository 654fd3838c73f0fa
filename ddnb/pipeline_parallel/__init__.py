"""Pipeline parallelism: the layers of an nn.Sequential split into stages, one per rank,
and each batch into micro-batches that flow through the stages so that several stages
compute at once. Naive first, then better:

    naive.py      NaiveModelParallel, partition_layers      one batch at a time (notebook 08);
                  (equal / params / time balanced)          the layers split into stages
    naive_training.py  train_split, train_single,      notebook 08's harness: the split trained,
                       median_step, step_summary       the one-process reference, the traces read
    schedules.py  Action, gpipe_schedule, one_f_one_b_schedule,          schedules as plain
                  interleaved_one_f_one_b_schedule, validate_schedule,   lists of actions
                  simulate, in_flight, bubble_fraction
    stage.py      PipelineStage                            a rank's slice and its messages
    executor.py   run_schedule, StepResult                 run a schedule on real stages
    reference.py  reference_grads, torch_pipeline_grads    one process; torch.distributed.pipelining
    demo.py       pipeline_step                            the notebook's GPT step, checked against both

Taught in `notebooks/09_pipeline_parallelism.ipynb` (after the naive layer split of
notebook 08, idle (p-1)/p of the time); the formulas are in `ddnb.cost.pipeline`, the
pictures in `ddnb.viz.pipeline`.
"""
from ddnb.pipeline_parallel.executor import StepResult, run_schedule, split_microbatches
from ddnb.pipeline_parallel.reference import reference_grads, torch_pipeline_grads
from ddnb.pipeline_parallel.schedules import (SCHEDULES, Action, bubble_fraction, get_schedule, gpipe_schedule,
                                              in_flight, interleaved_one_f_one_b_schedule, num_chunks,
                                              one_f_one_b_schedule, simulate, validate_schedule)
from ddnb.pipeline_parallel.naive import partition_layers
from ddnb.pipeline_parallel.stage import PipelineStage, check_microbatches

__all__ = ["SCHEDULES", "Action", "PipelineStage", "StepResult", "bubble_fraction", "check_microbatches",
           "get_schedule", "gpipe_schedule", "in_flight", "interleaved_one_f_one_b_schedule", "num_chunks",
           "one_f_one_b_schedule", "partition_layers", "reference_grads", "run_schedule", "simulate", "split_microbatches",
           "torch_pipeline_grads", "validate_schedule"]
