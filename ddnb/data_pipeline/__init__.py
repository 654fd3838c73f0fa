"""The data pipeline at scale: a generated image dataset stored three ways, each rank
reading only its shards, the cost of reading and preprocessing, and the cluster view.

    from ddnb.data_pipeline import make_images, write, ShardedReader, read_throughput
    samples = make_images(10_000)                                   # dataset.py
    stored = write(samples, "/tmp/ds", "webdataset", shard_size=1000)   # formats.py
    reader = ShardedReader(stored, world_size=4, rank=1)            # sharding.py
    read_throughput(stored, readers=2, cold=True)                   # throughput.py
    pipeline_bound(workers=4, shard_samples=1000, decode_s=2e-3, step_s=0.1)   # calculator.py

Taught in `notebooks/01b_data_pipeline.ipynb`.
"""
from ddnb.data_pipeline.calculator import GROWTH, drives_needed, pipeline_bound, read_bandwidth, samples_per_s
from ddnb.data_pipeline.dataset import Sample, augment, decode, make_images
from ddnb.data_pipeline.formats import FORMATS, Stored, check_readable, read_shard, write
from ddnb.data_pipeline.sharding import ShardedReader, rank_spans
from ddnb.data_pipeline.throughput import DecodedImages, decode_all, drop_cache, preprocess_cost, read_throughput

__all__ = ["DecodedImages", "FORMATS", "GROWTH", "Sample", "ShardedReader", "Stored", "augment", "check_readable", "decode", "decode_all",
           "drives_needed", "drop_cache", "make_images", "pipeline_bound", "preprocess_cost", "rank_spans",
           "read_bandwidth", "read_shard", "read_throughput", "samples_per_s", "write"]
