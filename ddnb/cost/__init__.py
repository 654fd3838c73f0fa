"""Cost models: what a distributed step should take, before it is measured.

`alpha_beta`: the alpha-beta-gamma model of all-reduce (Thakur et al. 2005) and its fit
(the measurements that give its parameters run on processes: `ddnb.bench.links`).
`all_to_all`: the same model for all-to-all, pairwise exchange and Bruck (Thakur et al. 2005).
`pipeline`: the bubble (p-1)/(m+p-1), step time and activation memory of pipeline
schedules (Huang et al. 2019; Narayanan et al. 2021).
`model_parallel`: bytes a naive layer split sends per step, and its per-rank idle time.
`zero`: bytes of model states per device, and bytes sent per step, under ZeRO stages 0-3
(Rajbhandari et al. 2020).
`scaling`: the predicted step time of data parallelism from 8 to thousands of workers
(parameter servers, tree, ring, halving-doubling, hierarchical and 2D-torus all-reduce).
`transformer`: parameters of a GPT, training FLOPs 6·N·D, MFU, days of training (Kaplan et al. 2020).
`memory_model`: training memory of a GPT on one device, states and activations (Korthikanti et al. 2022).
`published`: published models' sizes, tokens and compute, as their papers state them.
`layout`: one dp x pp x tp x cp layout's memory per worker and predicted step time, every axis.
`planner`: `plan`, every layout of a GPT on N workers ranked, and why each dropped one cannot run.
`megatron2021`: that model against Megatron-LM's Table 1 (Narayanan et al. 2021).
Each module names the notebook that teaches it; `notebooks/12_scalability.ipynb` combines them.
"""
from ddnb.cost.all_to_all import ALLTOALL_ALGORITHMS, alltoall_bytes_per_rank, alltoall_time
from ddnb.cost.alpha_beta import ALGORITHMS, allreduce_bytes_per_rank, allreduce_time, fit_alpha_beta
from ddnb.cost.memory_model import dataset_bytes, max_params, token_bytes, training_memory
from ddnb.cost.layout import Layout, layout_memory, layout_step_time
from ddnb.cost.model_parallel import boundary_bytes, model_parallel_bytes, sequential_idle_fractions
from ddnb.cost.pipeline import (interleaved_bubble_fraction, model_parallel_idle_fraction, peak_microbatches_in_flight,
                                pipeline_activation_bytes, pipeline_bubble_fraction, pipeline_step_time,
                                zbh1_bubble_fraction)
from ddnb.cost.planner import plan
from ddnb.cost.scaling import (NETWORKS, STEP_ALGORITHMS, Network, communication_time, hierarchical_allreduce_time,
                               network, parameter_server_time, step_time, torus2d_allreduce_time)
from ddnb.cost.transformer import (flops_per_token, model_flops_utilization, training_days, training_flops,
                                   transformer_params)
from ddnb.cost.zero import zero_comm_bytes, zero_memory, zero_memory_parts

__all__ = [
    # alpha_beta
    "ALGORITHMS", "allreduce_bytes_per_rank", "allreduce_time", "fit_alpha_beta",
    # all_to_all
    "ALLTOALL_ALGORITHMS", "alltoall_bytes_per_rank", "alltoall_time",
    # pipeline, model_parallel
    "interleaved_bubble_fraction", "model_parallel_idle_fraction", "peak_microbatches_in_flight",
    "pipeline_activation_bytes", "pipeline_bubble_fraction", "pipeline_step_time", "zbh1_bubble_fraction",
    "boundary_bytes", "model_parallel_bytes", "sequential_idle_fractions",
    # scaling
    "NETWORKS", "STEP_ALGORITHMS", "Network", "communication_time", "hierarchical_allreduce_time", "network",
    "parameter_server_time", "step_time", "torus2d_allreduce_time",
    # zero, memory_model, transformer
    "zero_comm_bytes", "zero_memory", "zero_memory_parts",
    "dataset_bytes", "max_params", "token_bytes", "training_memory",
    "flops_per_token", "model_flops_utilization", "training_days", "training_flops", "transformer_params",
    # layout, planner
    "Layout", "layout_memory", "layout_step_time", "plan",
]
