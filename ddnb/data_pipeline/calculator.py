"""The cluster view of the input pipeline: bandwidth to feed a model, drives to serve it,
and which stage bounds a step.

    need = read_bandwidth(samples_per_s=global_batch / step_s, bytes_per_sample=110e3)  # bytes/s
    drives_needed(need, drive_bytes_per_s=3e9)          # NVMe drives (or storage nodes) to serve it
    pipeline_bound(workers=4, shard_samples=1000, decode_s=2e-3, step_s=0.1, batch_size=256)

Read bandwidth is samples/s x bytes/sample (per node: its share of the samples). Each
stage of a DataLoader pipeline works on the next batches while the device computes the
current one, so a step takes the slowest stage, max(storage, decode / workers, compute)
(PyTorch documentation, "torch.utils.data", Multi-process data loading; the
input-bound/compute-bound view of Mohan et al. 2021, "Analyzing and Mitigating Data
Stalls in DNN Training", VLDB 14(5)); with no workers nothing overlaps and a step is their
sum. Storage per batch = batch · (bytes/sample / read bandwidth + open_s / shard_samples):
a shard costs one open (a seek, a metadata lookup, a request to object storage), paid once
per shard_samples samples.
`GROWTH` lists dataset sizes with their sources. Taught in `notebooks/01b_data_pipeline.ipynb`.
"""
from __future__ import annotations

import math

from ddnb._checks import Checks

STAGES = ("storage", "decode", "compute")   # the parts of a step pipeline_bound returns

GROWTH = [  # name, year, samples, unit, bytes on disk, source
    {"dataset": "ImageNet (ILSVRC-2012 train)", "year": 2009, "samples": 1.28e6, "unit": "images", "bytes": 1.5e11,
     "source": "Deng et al. 2009, CVPR; Russakovsky et al. 2015, IJCV (1,281,167 training images, ~150 GB of JPEG)"},
    {"dataset": "C4", "year": 2019, "samples": 1.56e11, "unit": "tokens", "bytes": 7.5e11,
     "source": "Raffel et al. 2020, JMLR, Sec. 2.2 ('about 750 GB'); ~156 B tokens: Dodge et al. 2021, EMNLP "
               "('Documenting Large Webtext Corpora')"},
    {"dataset": "LAION-5B", "year": 2022, "samples": 5.85e9, "unit": "image-text pairs", "bytes": 2.4e14,
     "source": "Schuhmann et al. 2022, NeurIPS Datasets and Benchmarks (5.85 B pairs, ~240 TB of images)"},
    {"dataset": "FineWeb", "year": 2024, "samples": 1.5e13, "unit": "tokens", "bytes": 4.4e13,
     "source": "Penedo et al. 2024, 'The FineWeb Datasets', NeurIPS Datasets and Benchmarks (15 T tokens, 44 TB)"},
    {"dataset": "Llama 3 pre-training mix", "year": 2024, "samples": 1.56e13, "unit": "tokens", "bytes": 6.2e13,
     "source": "Dubey et al. 2024, 'The Llama 3 Herd of Models', Sec. 3.1 (15.6 T tokens); bytes estimated "
               "at ~4 bytes of text per token (not published)"},
]


def samples_per_s(global_batch: int, step_s: float) -> float:
    """Samples the whole job consumes per second: global_batch / step_s."""
    with Checks("samples_per_s") as check:
        check.integer("global_batch", global_batch, min=1)
        check.number("step_s", step_s, positive=True)
    return global_batch / step_s


def read_bandwidth(samples_per_s: float, bytes_per_sample: float, nodes: int = 1) -> float:
    """Bytes/s each of `nodes` nodes must read: samples_per_s x bytes_per_sample / nodes."""
    with Checks("read_bandwidth") as check:
        check.number("samples_per_s", samples_per_s, positive=True)
        check.number("bytes_per_sample", bytes_per_sample, positive=True)
        check.integer("nodes", nodes, min=1)
    return samples_per_s * bytes_per_sample / nodes


def drives_needed(bytes_per_s: float, drive_bytes_per_s: float, utilization: float = 1.0) -> int:
    """Drives (or storage nodes) of drive_bytes_per_s each, used at `utilization` of their
    bandwidth, that serve bytes_per_s: ceil(bytes_per_s / (drive_bytes_per_s · utilization))."""
    with Checks("drives_needed") as check:
        check.number("bytes_per_s", bytes_per_s, positive=True)
        check.number("drive_bytes_per_s", drive_bytes_per_s, positive=True)
        check.number("utilization", utilization, positive=True, max=1)
    return math.ceil(bytes_per_s / (drive_bytes_per_s * utilization) - 1e-9)


def pipeline_bound(workers: int, shard_samples: int, decode_s: float, step_s: float, batch_size: int = 256,
                   bytes_per_sample: float = 110e3, read_bytes_per_s: float = 500e6, open_s: float = 0.01) -> dict:
    """Seconds per batch of each stage, {"storage", "decode", "compute"}, the resulting
    "step_s" (the max with workers >= 1, the sum with 0) and "bound", the stage that sets it.
    decode_s: decode + augment seconds per sample on one core, shared by the workers."""
    with Checks("pipeline_bound") as check:
        check.integer("workers", workers, min=0, max=1024)
        check.integer("shard_samples", shard_samples, min=1)
        check.integer("batch_size", batch_size, min=1)
        check.positive_numbers(step_s=step_s, bytes_per_sample=bytes_per_sample, read_bytes_per_s=read_bytes_per_s)
        check.number("decode_s", decode_s, min=0)
        check.number("open_s", open_s, min=0)
    parts = {"storage": batch_size * (bytes_per_sample / read_bytes_per_s + open_s / shard_samples),
             "decode": batch_size * decode_s / max(workers, 1),
             "compute": step_s}
    bound = max(parts, key=parts.get)
    total = max(parts.values()) if workers >= 1 else sum(parts.values())
    return {**parts, "step_s": total, "bound": bound}
