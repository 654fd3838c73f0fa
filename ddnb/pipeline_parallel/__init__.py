"""Pipeline parallelism: the layers of an nn.Sequential split into stages, one per rank,
and each batch into micro-batches that flow through the stages so that several stages
compute at once. Naive first, then better:

    naive.py      NaiveModelParallel, partition_layers      one batch at a time (notebook 08);
                  (equal / params / time balanced)          the layers split into stages
    naive_training.py  train_split, train_single,      notebook 08's harness: the split trained,
                       median_step, step_summary       the one-process reference, the traces read
    actions.py    Action, Schedule, placement_of, simulate,     a schedule as data (F, B, W;
                  in_flight, bubble_fraction, parse_schedule    which rank holds which stage)
    schedules.py  gpipe_schedule, one_f_one_b_schedule,         schedules as plain lists of
                  interleaved_one_f_one_b_schedule,             actions, by name
                  get_schedule, SCHEDULES
    zero_bubble.py  zbh1_schedule, zbv_schedule,                the backward split into B and
                    dualpipev_schedule                          W, the W's in the bubbles
    check.py      validate_schedule, ScheduleReport             proven before anything runs
    split_backward.py  backward_input, backward_weight       the backward split into B and W
    stage.py      PipelineStage, build_stages              a rank's slices (placed) and messages
    executor.py   run_schedule, StepResult                 run any checked schedule on real stages
    reference.py  reference_grads, torch_pipeline_grads    one process; torch.distributed.pipelining
    demo.py       pipeline_step                            the notebook's GPT step, checked against both

Taught in `notebooks/09_pipeline_parallelism.ipynb` (after the naive layer split of
notebook 08, idle (p-1)/p of the time), the zero-bubble schedules in
`notebooks/09b_zero_bubble.ipynb`; the formulas are in `ddnb.cost.pipeline`, the
pictures in `ddnb.viz.pipeline`.
"""
from ddnb.pipeline_parallel.actions import parse_schedule
from ddnb.pipeline_parallel.executor import StepResult, run_schedule, split_microbatches
from ddnb.pipeline_parallel.reference import reference_grads, torch_pipeline_grads
from ddnb.pipeline_parallel.schedules import (SCHEDULES, WEIGHT, Action, Schedule, ScheduleReport, bubble_fraction,
                                              dualpipev_schedule, get_schedule, gpipe_schedule, in_flight,
                                              interleaved_one_f_one_b_schedule, num_chunks, one_f_one_b_schedule,
                                              placement_of, simulate, validate_schedule, zbh1_schedule, zbv_schedule)
from ddnb.pipeline_parallel.naive import partition_layers
from ddnb.pipeline_parallel.stage import PipelineStage, build_stages, check_microbatches

__all__ = ["SCHEDULES", "WEIGHT", "Action", "PipelineStage", "Schedule", "ScheduleReport", "StepResult",
           "bubble_fraction", "build_stages", "check_microbatches", "dualpipev_schedule", "get_schedule", "gpipe_schedule", "in_flight",
           "interleaved_one_f_one_b_schedule", "num_chunks", "one_f_one_b_schedule", "parse_schedule",
           "partition_layers", "placement_of", "reference_grads", "run_schedule", "simulate", "split_microbatches",
           "torch_pipeline_grads", "validate_schedule", "zbh1_schedule", "zbv_schedule"]
