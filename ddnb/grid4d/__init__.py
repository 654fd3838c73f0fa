"""4-D parallelism: the small GPT on one dp × pp × tp × cp grid, built from the package's
own pieces (tensor_parallel, pipeline_parallel, context_parallel, sharding) and checked
against one process on the same global batch.

    layout.py   Layout (dp, pp, tp, cp, zero, checkpointing, microbatches) and its
                validate, feasible_layouts, Layout.from_plan (a ddnb.plan row)
    train.py    train_4d on a ProcessGrid, train_reference (one process), shard_gpt

Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM", Sec. 2.3 and 3. Not yet taught: the capstone notebook (notebooks/16_capstone, to be
written) will; it combines `notebooks/09_pipeline_parallelism.ipynb`, `notebooks/10_tensor_parallelism.ipynb`,
`notebooks/11_memory_sharding.ipynb` and `notebooks/13_sequence_context_expert.ipynb`.
"""
from ddnb.grid4d.layout import Layout, factorizations, feasible_layouts
from ddnb.grid4d.train import shard_gpt, stage_boundaries, train_4d, train_reference

__all__ = ["Layout", "factorizations", "feasible_layouts", "shard_gpt", "stage_boundaries", "train_4d",
           "train_reference"]
