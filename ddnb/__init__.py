"""ddnb: distributed deep-learning training, built step by step in notebooks.

What a learner types in a notebook is re-exported here; the rest is reached by its module
path (ddnb.testing, ddnb.viz, ...). Imports are lazy, so worker processes that only need
`ddnb.runtime.worker` do not pay for ipyparallel or matplotlib.
Taught from `notebooks/00_getting_started.ipynb` on.

Vocabulary. These words mean one thing each, in the code, the docstrings and the notebooks:

- **rank**: a process's index 0..N-1 in the torch.distributed world; **world size** N: the
  number of ranks. In a subgroup a process also has a **group rank** (its index in the
  group's ranks); `ddnb.collectives.p2p` converts group ranks to global ones, once.
  **local rank**: the index among the ranks on the same host (the GPU it drives).
- **worker**: a process that trains (forward, backward); every rank is one. A **server**
  (`ddnb.parameter_server`) is a rank that holds parameters and applies updates instead.
  An **engine** is an ipyparallel engine: the process a `Cluster` runs a worker in.
  Engine ids are ipyparallel's bookkeeping, never ranks.
- **axis**: a direction of the process grid (`ProcessGrid`: dp, pp, tp), a way of grouping
  ranks; **dim**: a dimension of a tensor. (torchtitan names mesh axes the same way.)
- **shard**: the part of a tensor, a batch or the flat parameter vector that one rank holds
  (ZeRO, FSDP, a parameter server's shards: `shard_parameters`). **partition**: the split
  of a model's layers into contiguous stages (`partition_layers`). A **stage** is the
  layers one pipeline rank holds; a **micro-batch** is a slice of the batch that flows
  through the stages.
- **checkpoint**: a training run's state saved to disk so that it can go on
  (`ddnb.data_parallel.checkpoint`). **activation checkpointing**: keeping only some
  activations in forward and recomputing the rest in backward
  (`ddnb.sharding.activation_checkpointing`).
- **bucket**: gradients all-reduced as one message (DDP, `BucketedDataParallel`).
- **step**: one optimizer update. **time** is wall-clock seconds measured on real
  processes; a time from a cost model is a **prediction** (`ddnb.cost`).
"""
__version__ = "0.1.0"

_EXPORTS = {
    "Cluster": "ddnb.runtime.cluster",
    "LostWorker": "ddnb.runtime.waiting",
    "ClusterError": "ddnb.runtime.errors",
    "WorkerError": "ddnb.runtime.errors",
    "WorkerLostError": "ddnb.runtime.errors",
    "WorkerTimeoutError": "ddnb.runtime.errors",
    "ProcessGrid": "ddnb.process_grid",
    "plan": "ddnb.cost.planner",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'ddnb' has no attribute {name!r}")
