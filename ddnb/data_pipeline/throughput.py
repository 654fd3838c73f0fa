"""Read throughput and time to first batch of a stored dataset, cold or warm page cache,
and the per-sample cost of decoding and augmenting.

    drop_cache(stored)                         # True where posix_fadvise(DONTNEED) exists
    r = read_throughput(stored, readers=2, cold=True)
    r["samples_per_s"], r["mb_per_s"], r["first_sample_s"]
    preprocess_cost(samples[:200])             # {"decode_s": ..., "augment_s": ...} per sample

Reading is timed as a torch DataLoader over the shards (an IterableDataset: with `readers`
worker processes, worker w reads shards w, w + readers, ...), so `readers` is DataLoader's
num_workers and 0 reads in the training process. Only the stored bytes are read here (no
decode), so the number is the storage side of the pipeline; `preprocess_cost` is the CPU
side. "Cold" asks the kernel to drop each file's cached pages first with
os.posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) (POSIX.1-2001; Linux drops clean pages,
no root needed); on a file system that cannot evict (tmpfs, some overlays) or without
posix_fadvise the read stays warm, and `drop_cache` says so by returning False. What is
measured is this machine's disk and page cache on its 2 cores, nothing more.
Taught in `notebooks/01b_data_pipeline.ipynb`.
"""
from __future__ import annotations

import os
import time

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ddnb._checks import Checks
from ddnb.data_pipeline.dataset import augment, decode


def _files(stored) -> list[str]:
    return [os.path.join(d, f) for d, _, fs in os.walk(stored.root) for f in fs]


def drop_cache(stored) -> bool:
    """Ask the kernel to evict every file of `stored` from the page cache. False where
    os.posix_fadvise does not exist (not Linux/Unix) or the file system ignores it (tmpfs)."""
    if not hasattr(os, "posix_fadvise"):
        return False
    fstype = _fstype(stored.root)
    for path in _files(stored):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return fstype not in ("tmpfs", "ramfs", "overlay")


def _fstype(path: str) -> str:
    """The file system type of the mount holding `path` (from /proc/mounts; '' if unknown)."""
    try:
        mounts = [line.split() for line in open("/proc/mounts")]
    except OSError:
        return ""
    path = os.path.realpath(path)
    best = max((m for m in mounts if path == m[1] or path.startswith(m[1].rstrip("/") + "/")),
               key=lambda m: len(m[1]), default=None)
    return best[2] if best else ""


class _ShardBytes(IterableDataset):
    """Every stored sample's bytes; DataLoader worker w of W reads shards w::W."""

    def __init__(self, stored):
        self.stored = stored

    def __iter__(self):
        from ddnb.data_pipeline.formats import read_shard

        info = get_worker_info()
        w, workers = (info.id, info.num_workers) if info else (0, 1)
        for k in range(w, len(self.stored.shards), workers):
            for s in read_shard(self.stored, k):
                yield len(s.data)


def read_throughput(stored, readers: int = 0, cold: bool = False, batch_size: int = 64) -> dict:
    """One pass over `stored` by a DataLoader with `readers` workers: samples/s, MB/s of
    sample bytes (1e6 bytes), seconds to the first batch (worker start-up included) and in
    all; `cold`: drop the page cache first (see `drop_cache`; `cold_ok` says if it could)."""
    with Checks("read_throughput") as check:
        check.integer("readers", readers, min=0, max=16)
        check.integer("batch_size", batch_size, min=1)
    cold_ok = drop_cache(stored) if cold else False
    loader = DataLoader(_ShardBytes(stored), batch_size=batch_size, num_workers=readers,
                        collate_fn=lambda sizes: sizes)
    t0 = time.perf_counter()
    first, samples, nbytes = None, 0, 0
    for sizes in loader:
        if first is None:
            first = time.perf_counter() - t0
        samples, nbytes = samples + len(sizes), nbytes + sum(sizes)
    total = time.perf_counter() - t0
    return {"format": stored.format, "readers": readers, "cold": cold, "cold_ok": cold_ok,
            "shard_size": max(stored.sizes), "samples": samples, "bytes": nbytes, "first_batch_s": first,
            "total_s": total, "samples_per_s": samples / total, "mb_per_s": nbytes / total / 1e6}


def preprocess_cost(samples: list, seed: int = 0, threads: int = 1) -> dict:
    """Seconds per sample to decode (Pillow) and to augment (crop, flip, standardize)
    `samples`, with torch limited to `threads` intra-op threads meanwhile (restored after).
    One, as in a DataLoader worker (PyTorch sets it there): on tiny tensors a pool of
    threads costs more than the work, many times more on a loaded machine."""
    with Checks("preprocess_cost") as check:
        check.rule(isinstance(samples, list) and len(samples) > 0, "samples: need a non-empty list of Sample")
        check.integer("threads", threads, min=1, max=256)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        t0 = time.perf_counter()
        images = [decode(s.data) for s in samples]            # each uint8 (3, H, W)
        t1 = time.perf_counter()
        for i, image in enumerate(images):
            augment(image, seed + i)
        t2 = time.perf_counter()
    finally:
        torch.set_num_threads(before)
    return {"samples": len(samples), "decode_s": (t1 - t0) / len(samples), "augment_s": (t2 - t1) / len(samples),
            "threads": threads}


class DecodedImages(torch.utils.data.Dataset):
    """Samples decoded and augmented on the fly, for a DataLoader: item i is
    (augment(decode(samples[i].data), seed + i), label), float32 (3, H, W) and an int.
    With `cache` (uint8 (n, 3, H, W) from `decode_all`), decoding is skipped: offline
    preprocessing, paid once, then only the augmentation each epoch."""

    def __init__(self, samples: list, seed: int = 0, cache: torch.Tensor | None = None):
        self.samples, self.seed, self.cache = samples, seed, cache

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        image = self.cache[i] if self.cache is not None else decode(self.samples[i].data)   # uint8 (3, H, W)
        return augment(image, self.seed + i), self.samples[i].label


def decode_all(samples: list, path: str | None = None) -> torch.Tensor:
    """uint8 (n, 3, H, W): every sample decoded once (offline preprocessing); saved to /
    loaded from `path` (torch.save) when given, as a cache that later epochs read."""
    if path is not None and os.path.exists(path):
        return torch.load(path)
    images = torch.stack([decode(s.data) for s in samples])     # (n, 3, H, W)
    if path is not None:
        torch.save(images, path)
    return images
