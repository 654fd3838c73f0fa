"""4-D parallelism: the small GPT on one dp × pp × tp × cp grid, built from the package's
own pieces (tensor_parallel, pipeline_parallel, context_parallel, sharding) and checked
against one process on the same global batch.

    layout.py   Layout (dp, pp, tp, cp, zero, checkpointing, microbatches) and its
                validate, feasible_layouts, Layout.from_plan (a ddnb.plan row)
    train.py    train_4d on a ProcessGrid, train_reference (one process), shard_gpt

Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM", Sec. 2.3 and 3. Taught in
`notebooks/16_capstone.ipynb` (it combines chapters 09, 10, 11 and 13).
"""
from ddnb.grid4d.layout import Layout, factorizations, feasible_layouts
from ddnb.grid4d.train import shard_gpt, stage_boundaries, train_4d, train_reference

__all__ = ["Layout", "factorizations", "feasible_layouts", "shard_gpt", "stage_boundaries", "train_4d",
           "train_reference"]
