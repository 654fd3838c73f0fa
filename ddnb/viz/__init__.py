"""Plots and widgets. Each plot is one function that takes plain data (lists, dicts), so
it can be drawn and tested without a cluster."""
from ddnb.viz.allreduce_steps import AllreduceAnimation, allreduce_steps, plot_allreduce_steps
from ddnb.viz.bandwidth import plot_allreduce_times, plot_bytes_per_rank
from ddnb.viz.buffers import plot_buffers
from ddnb.viz.gradients import (GradientFlowExplorer, plot_bucket_timeline, plot_gradient_heatmap,
                                plot_horovod_timeline)
from ddnb.viz.memory import plot_memory
from ddnb.viz.pipeline import PipelineExplorer, plot_activation_peaks, plot_bubble, plot_pipeline, plot_schedule
from ddnb.viz.scaling import plot_scaling, plot_time_vs_workers, scaling_table
from ddnb.viz.tensor_parallel import TensorParallelExplorer, plot_shard_layout, plot_tp_traffic
from ddnb.viz.timeline import plot_timeline
from ddnb.viz.widgets import WorkerCountExplorer

__all__ = ["AllreduceAnimation", "GradientFlowExplorer", "WorkerCountExplorer", "plot_bucket_timeline",
           "plot_gradient_heatmap", "plot_memory", "plot_horovod_timeline", "allreduce_steps", "plot_allreduce_steps",
           "plot_allreduce_times", "plot_buffers", "plot_bytes_per_rank", "plot_time_vs_workers", "plot_timeline"]
__all__ += ["plot_scaling", "scaling_table"]
__all__ += ["PipelineExplorer", "plot_activation_peaks", "plot_bubble", "plot_pipeline", "plot_schedule"]
__all__ += ["TensorParallelExplorer", "plot_shard_layout", "plot_tp_traffic"]
