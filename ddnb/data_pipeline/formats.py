"""The same samples stored three ways, read back through one API.

    stored = write(samples, "/tmp/ds/tar", "webdataset", shard_size=1000)
    check_readable(stored)                          # ValueError naming every bad shard
    for s in read_shard(stored, 3): ...             # Sample(key, data, label), in order

- "files": one file per sample (`shard-00003/000042.7.jpg`: key, label, encoding), a
  directory per shard of `shard_size` files: what a dataset looks like when copied as is.
  Reading a sample costs an open, a stat and a read: per-file overhead dominates small
  samples, and a parallel file system pays a metadata lookup for each.
- "webdataset": POSIX tar shards (`shard-00003.tar`), members `<key>.jpg` and `<key>.cls`,
  read sequentially (Aizman et al. 2019, "High Performance I/O For Large Scale Deep
  Learning", the paper behind the `webdataset` package): one open per shard, large reads.
- "litdata": Lightning's chunked binary format (`litdata`, its `BinaryWriter` and
  `StreamingDataset`): chunks of `shard_size` items plus an `index.json`, built to stream
  from object storage with random access by index. Tried first of the two candidates
  (`mosaicml-streaming` the other) and kept: it writes and reads a local directory with no
  network (checked under `unshare -n`). Both declare torchvision, whose newest release pulls
  a newer torch over the pinned one; litdata runs without it for raw bytes, so
  scripts/setup.sh installs it with --no-deps.

A shard is the unit a rank opens (`ddnb.data_pipeline.sharding`). `check_readable` looks
at every shard (a tar's headers, a chunk's size against the index) without decoding, so a
missing or corrupt shard is named before any rank starts to read.
Taught in `notebooks/01b_data_pipeline.ipynb`.
"""
from __future__ import annotations

import json
import os
import tarfile
from dataclasses import dataclass

from ddnb._checks import Checks
from ddnb.data_pipeline.dataset import Sample

FORMATS = ("files", "webdataset", "litdata")


@dataclass(frozen=True)
class Stored:
    """A dataset on disk: its format, root directory, shard paths and samples per shard."""

    format: str
    root: str
    shards: tuple
    sizes: tuple

    def __len__(self) -> int:
        return sum(self.sizes)

    def nbytes(self) -> int:
        """Bytes on disk (every file under root)."""
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(self.root) for f in fs)


def _ext(data: bytes) -> str:
    return "png" if data[:4] == b"\x89PNG" else "jpg"


def write(samples: list, root: str, fmt: str, shard_size: int) -> Stored:
    """Store `samples` (a list of Sample) under `root` (created) as `fmt`, `shard_size`
    samples per shard (the last shard holds the rest)."""
    with Checks("write") as check:
        check.choice("fmt", fmt, FORMATS)
        check.integer("shard_size", shard_size, min=1)
        check.rule(isinstance(samples, list) and len(samples) > 0 and all(isinstance(s, Sample) for s in samples),
                   "samples: need a non-empty list of Sample (from make_images)")
    os.makedirs(root, exist_ok=True)
    groups = [samples[i:i + shard_size] for i in range(0, len(samples), shard_size)]
    shards = []
    if fmt == "files":
        for k, group in enumerate(groups):
            d = os.path.join(root, f"shard-{k:05d}")
            os.makedirs(d, exist_ok=True)
            for s in group:
                with open(os.path.join(d, f"{s.key}.{s.label}.{_ext(s.data)}"), "wb") as f:
                    f.write(s.data)
            shards.append(d)
    elif fmt == "webdataset":
        import webdataset as wds

        for k, group in enumerate(groups):
            path = os.path.join(root, f"shard-{k:05d}.tar")
            with wds.TarWriter(path, encoder=False) as sink:
                for s in group:
                    sink.write({"__key__": s.key, _ext(s.data): s.data, "cls": str(s.label).encode()})
            shards.append(path)
    else:
        from litdata.streaming.writer import BinaryWriter

        writer = BinaryWriter(root, chunk_size=shard_size)
        for i, s in enumerate(samples):
            writer.add_item(i, {"key": s.key, "data": s.data, "label": s.label})
        writer.done()
        writer.merge()
        chunks = json.load(open(os.path.join(root, "index.json")))["chunks"]
        shards = [os.path.join(root, c["filename"]) for c in chunks]
    return Stored(fmt, root, tuple(shards), tuple(len(g) for g in groups))


def _litdata_dataset(root: str):
    from litdata import StreamingDataset

    return StreamingDataset(root)


def read_shard(stored: Stored, k: int, dataset=None):
    """Yield shard k's samples in stored order, as Sample(key, data, label). `dataset`: an
    open litdata StreamingDataset to reuse (litdata format only)."""
    with Checks("read_shard") as check:
        check.integer("k", k, min=0, max=len(stored.shards) - 1, why=f" (the dataset has {len(stored.shards)} shards)")
    path = stored.shards[k]
    if stored.format == "files":
        for name in sorted(os.listdir(path)):
            key, label, _ = name.split(".")
            with open(os.path.join(path, name), "rb") as f:
                yield Sample(key, f.read(), int(label))
    elif stored.format == "webdataset":
        import webdataset as wds

        # webdataset's own reader: the tar streamed front to back (Python's tarfile underneath),
        # members grouped by key into {"__key__", "jpg" or "png", "cls"}, left as bytes (no .decode()).
        # The shard is already this rank's and this worker's (sharding.py): no splitting here.
        everything = lambda urls: urls  # noqa: E731
        for parts in wds.WebDataset(path, shardshuffle=False, empty_check=False, nodesplitter=everything,
                                    workersplitter=everything):
            yield Sample(parts["__key__"], parts.get("jpg", parts.get("png")), int(parts["cls"]))
    else:
        ds = dataset if dataset is not None else _litdata_dataset(stored.root)
        first = sum(stored.sizes[:k])
        for i in range(first, first + stored.sizes[k]):
            item = ds[i]
            yield Sample(item["key"], bytes(item["data"]), int(item["label"]))


def check_readable(stored: Stored) -> None:
    """ValueError naming every shard that is missing, unreadable or the wrong size,
    without decoding a sample: a directory's file count, a tar's member headers, a litdata
    chunk's size against index.json. Cheap enough to run on every rank before reading."""
    bad = []
    chunks = None
    if stored.format == "litdata":
        try:
            chunks = json.load(open(os.path.join(stored.root, "index.json")))["chunks"]
        except (OSError, ValueError, KeyError) as e:
            bad.append(f"{os.path.join(stored.root, 'index.json')}: {e}")
    for k, (path, size) in enumerate(zip(stored.shards, stored.sizes)):
        try:
            if stored.format == "files":
                found = len(os.listdir(path))
                if found != size:
                    raise ValueError(f"{found} files, expected {size}")
            elif stored.format == "webdataset":
                with tarfile.open(path) as tar:
                    found = len(tar.getmembers())
                if found != 2 * size:
                    raise ValueError(f"{found} tar members, expected {2 * size}")
            elif chunks is not None:
                want = chunks[k]["chunk_bytes"]
                found = os.path.getsize(path)
                if found != want:
                    raise ValueError(f"{found} bytes, index.json says {want}")
        except (OSError, tarfile.TarError, ValueError) as e:
            bad.append(f"shard {k} ({path}): {e}")
    if bad:
        raise ValueError(f"check_readable: {len(bad)} unreadable shard(s) in the {stored.format} dataset at "
                         f"{stored.root}: " + "; ".join(bad))
