"""Plots and widgets. Each plot is one function that takes plain data (lists, dicts), so
it can be drawn and tested without a cluster; the widgets that run work on a cluster when a
control moves are in `ddnb.viz.widgets` (this package's modules never import them; a few
are re-exported here).
Each module names the notebook that teaches it, from `notebooks/00_getting_started.ipynb` on.
"""
from ddnb.viz.allreduce_steps import AllreduceAnimation, allreduce_steps, plot_allreduce_steps
from ddnb.viz.bandwidth import plot_allreduce_times, plot_bytes_per_rank
from ddnb.viz.buffers import plot_buffers
from ddnb.viz.gradient_flow import plot_gradient_flow
from ddnb.viz.gradients import (GradientFlowExplorer, plot_bucket_timeline, plot_gradient_heatmap,
                                plot_horovod_timeline)
from ddnb.viz.growth import plot_model_growth
from ddnb.viz.input_bound import InputBoundExplorer, plot_input_bound
from ddnb.viz.memory import plot_memory
from ddnb.viz.moe import plot_expert_load
from ddnb.viz.memory_calculator import MemoryCalculator, plot_training_memory
from ddnb.viz.pipeline import (PipelineExplorer, plot_activation_peaks, plot_bubble, plot_pipeline, plot_schedule,
                               plot_schedules)
from ddnb.viz.profile_picker import ProfilePicker
from ddnb.viz.schedule_editor import ScheduleEditor
from ddnb.viz.scaling import plot_scaling, plot_time_vs_workers, scaling_table
from ddnb.viz.scaling_model import (ScalingExplorer, plot_efficiency, plot_emulated_scaling, plot_predicted_vs_measured,
                                    plot_step_times)
from ddnb.viz.sharding import ZeroMemoryExplorer, plot_zero_stages
from ddnb.viz.single_device import plot_loader_throughput, plot_step_throughput, plot_training_days
from ddnb.viz.tasks import plot_ensemble, plot_search, plot_task_timeline
from ddnb.viz.tensor_parallel import TensorParallelExplorer, plot_shard_layout, plot_tp_traffic
from ddnb.viz.timeline import plot_timeline
from ddnb.viz.widgets.gradient_flow import GradientFlowWidget
from ddnb.viz.widgets.moe import MoELoadExplorer
from ddnb.viz.widgets.worker_count import WorkerCountExplorer

__all__ = [
    "MoELoadExplorer",
    "plot_expert_load",
    "ProfilePicker",
    "plot_emulated_scaling",
    # 00, 03, 05: collectives and all-reduce
    "AllreduceAnimation", "WorkerCountExplorer", "allreduce_steps", "plot_allreduce_steps", "plot_allreduce_times",
    "plot_buffers", "plot_bytes_per_rank", "plot_time_vs_workers", "plot_timeline",
    # 01: why distributed
    "MemoryCalculator", "plot_loader_throughput", "plot_model_growth", "plot_step_throughput", "plot_training_days",
    "plot_training_memory",
    # 01b: the data pipeline
    "InputBoundExplorer", "plot_input_bound",
    # 02: task parallelism
    "plot_ensemble", "plot_search", "plot_task_timeline",
    # 06, 07: data parallelism, Horovod
    "GradientFlowWidget", "plot_gradient_flow",
    "GradientFlowExplorer", "plot_bucket_timeline", "plot_gradient_heatmap", "plot_horovod_timeline", "plot_scaling",
    "scaling_table",
    # 08-11: model, pipeline and tensor parallelism, sharding
    "plot_memory", "PipelineExplorer", "plot_activation_peaks", "plot_bubble", "plot_pipeline", "plot_schedule",
    "ScheduleEditor", "plot_schedules",
    "TensorParallelExplorer", "plot_shard_layout", "plot_tp_traffic", "ZeroMemoryExplorer", "plot_zero_stages",
    # 12: scalability
    "ScalingExplorer", "plot_efficiency", "plot_predicted_vs_measured", "plot_step_times",
]
