"""Data parallelism: every rank holds a replica of the model and trains on its own shard
of each batch; gradients are averaged across ranks after backward, so all replicas take
the same step (the global-batch step). Naive first, then better:

    sampler.py    ShardSampler, shard_indices      each rank a disjoint shard, reshuffled per epoch
    replicate.py  replicate, check_replicas        replicas start bit-identical, or a clear error
    naive.py      NaiveDataParallel                one all-reduce per parameter, after backward
    bucketed.py   BucketedDataParallel             buckets all-reduced from autograd hooks,
                                                   overlapping backward (as torch DDP); overlap_stats
    horovod.py    horovod_optimizer, horovod_timeline, horovod_timeline_events
                                                   the same training with Horovod, and its timeline
    grad_flow.py  gradient_flow, record_gradient_flow  per layer and rank, live: local gradient, its bucket,
                                                   the bucket's all-reduce start/end, the average
    wrappers.py   make_wrapper, STRATEGIES         one constructor for naive / bucketed / DDP / Horovod
    demo.py       train_dp                         chapter 06's first run, traced
    ddp_buckets.py ddp_bucket_bytes                torch DDP's buckets, per step, seen by a comm hook

Taught in `notebooks/06_data_parallelism.ipynb` and `notebooks/07_horovod.ipynb` (DDP's buckets
in `notebooks/12_scalability.ipynb`); measured
by `python -m ddnb.bench dp` (`ddnb/bench/dp.py`).
"""
from ddnb.data_parallel.bucketed import BucketedDataParallel, assign_buckets, overlap_stats
from ddnb.data_parallel.horovod import horovod_optimizer, horovod_timeline, horovod_timeline_events
from ddnb.data_parallel.naive import NaiveDataParallel, allreduce_names, grad_norms
from ddnb.data_parallel.replicate import (ReplicaMismatchError, broadcast_module, check_replicas, checksum,
                                          replicate)
from ddnb.data_parallel.sampler import ShardSampler, shard_indices, shard_size
from ddnb.data_parallel.wrappers import STRATEGIES, make_wrapper

__all__ = ["STRATEGIES", "BucketedDataParallel", "NaiveDataParallel", "ReplicaMismatchError", "ShardSampler", "allreduce_names",
           "assign_buckets", "broadcast_module", "check_replicas", "checksum", "grad_norms", "horovod_optimizer",
           "horovod_timeline", "horovod_timeline_events", "make_wrapper", "overlap_stats", "replicate", "shard_indices", "shard_size"]
