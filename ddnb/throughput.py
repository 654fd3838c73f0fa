"""Measured throughput on one device: the limits that make training distributed.

    peak = matmul_flops_per_second(n=1024)              FLOP/s of a big (n, n) @ (n, n)
    rows = step_throughput(cfg, [1, 4, 16])             tokens/s of a GPT training step by batch
    ds = PreprocessedImages(256, work=30)               generated images, CPU-heavy transform
    PreprocessedImages(256, work=1, read_s=0.002)       ... or waiting on storage (I/O-bound)
    loader_throughput(ds, num_workers=2)                samples/s of a torch DataLoader
    overlapped_epoch(ds, compute_s=0.02, num_workers=1) loading while the device computes

The device's peak is what a large matrix multiply reaches (2·n³ FLOPs, `ddnb.flops.matmul_flops`);
a training step reaches a fraction of it, its model FLOPs utilization (Chowdhery et al.
2022, "PaLM", Sec. 4.1), and that fraction grows with the batch until the device is busy.
The input pipeline is the other limit: if preparing a batch on the CPU takes L seconds and
the device step C, a loop that does one then the other takes L + C per batch; a DataLoader
with workers prepares the next batches in other processes while the device computes,
max(L / workers, C) per batch (PyTorch documentation, "torch.utils.data", Multi-process
data loading). On a GPU the step runs on the device while the CPU loads; on this CPU-only
machine `overlapped_epoch` stands the device step in with `time.sleep`, which leaves the
cores to the loader as a GPU would.
Taught in `notebooks/01_why_distributed.ipynb`.
"""
from __future__ import annotations

import time

import torch
from torch.utils.data import DataLoader, Dataset

from ddnb._checks import Checks, check_positive_ints
from ddnb.flops import flops_per_token, matmul_flops
from ddnb.models import GPTConfig, gpt, lm_loss, synthetic_task


def matmul_flops_per_second(n: int = 1024, repeats: int = 5, dtype=torch.float32) -> float:
    """2·n³ / t for the fastest of `repeats` (n, n) @ (n, n) products: the practical peak
    FLOP/s of this device (after one warm-up product)."""
    check_positive_ints("matmul_flops_per_second", n=n, repeats=repeats)
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=g).to(dtype)            # (n, n)
    b = torch.randn(n, n, generator=g).to(dtype)            # (n, n)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b                                               # (n, n)
        best = min(best, time.perf_counter() - t0)
    return matmul_flops(n, n, n) / best


def step_throughput(config: GPTConfig, batch_sizes, steps: int = 3, seed: int = 0) -> list[dict]:
    """For each batch size B: the fastest of `steps` Adam training steps (on a shared
    machine, the one least disturbed by others) of
    `ddnb.models.gpt(config)` on (B, T) tokens (after one warm-up step), as rows
    {batch_size, step_s, tokens_per_s, flops_per_s}, where flops_per_s counts the model's
    FLOPs, `ddnb.flops.flops_per_token` (untied head: its V·d are in the matmul weights)."""
    batch_sizes = list(batch_sizes)
    check_positive_ints("step_throughput", steps=steps, **{f"batch_sizes[{i}]": b for i, b in enumerate(batch_sizes)})
    per_token = flops_per_token(config.n_layers, config.d_model, config.vocab_size, config.seq_len,
                                config.mlp_ratio)
    rows = []
    for B in batch_sizes:
        model = gpt(config, seed=seed)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        times = []
        for i, (idx, targets) in enumerate(synthetic_task(config, B, steps + 1, seed)):   # (B, T) each
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            lm_loss(model(idx), targets).backward()
            opt.step()
            if i > 0:                                       # step 0 warms up (allocations, Adam state)
                times.append(time.perf_counter() - t0)
        step_s = min(times)
        tokens = B * config.seq_len / step_s
        rows.append({"batch_size": B, "step_s": step_s, "tokens_per_s": tokens, "flops_per_s": tokens * per_token})
    return rows


def preprocess(image: torch.Tensor, work: int) -> torch.Tensor:
    """A stand-in for decoding and augmenting an image on the CPU: `work` rounds of a 5-point
    blur, then standardization. (C, H, W) -> (C, H, W). Small tensors, so it runs on one
    core whichever process calls it."""
    x = image.float()
    for _ in range(work):
        x = (x + x.roll(1, -1) + x.roll(-1, -1) + x.roll(1, -2) + x.roll(-1, -2)) / 5
    return (x - x.mean()) / (x.std() + 1e-6)


class PreprocessedImages(Dataset):
    """n generated uint8 images (C, H, W), sample i a pure function of (i, seed), each
    passed through `preprocess(image, work)` when loaded; label i % 10. `read_s` seconds
    of waiting per sample stand in for reading it from network storage (I/O, not CPU).
    The same samples come out whatever the number of DataLoader workers."""

    def __init__(self, n: int = 256, shape=(3, 32, 32), work: int = 30, seed: int = 0, read_s: float = 0.0):
        with Checks("PreprocessedImages") as check:
            check.positive_ints(n=n, work=work)
            check.number("read_s", read_s, min=0, why=" (seconds)")
        self.n, self.shape, self.work, self.seed, self.read_s = n, tuple(shape), work, seed, read_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.read_s:
            time.sleep(self.read_s)                         # the read: the CPU is free meanwhile
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        image = torch.randint(0, 256, self.shape, generator=g, dtype=torch.uint8)   # (C, H, W)
        return preprocess(image, self.work), i % 10


def _timed_pass(loader, per_batch=None) -> dict:
    """Iterate `loader` once, calling `per_batch()` after each batch: total seconds, the time
    to the first batch (worker start-up and the first batch's preparation) and the seconds
    after it, with the number of batches and samples."""
    t0 = time.perf_counter()
    first = None
    batches = samples = first_samples = 0
    for _, y in loader:
        if first is None:
            first, first_samples = time.perf_counter(), len(y)
        if per_batch is not None:
            per_batch()
        batches, samples = batches + 1, samples + len(y)
    end = time.perf_counter()
    first = end if first is None else first
    return {"seconds": end - t0, "first_batch_s": first - t0, "after_first_s": end - first,
            "batches": batches, "samples": samples, "after_first_samples": samples - first_samples}


def loader_throughput(dataset: Dataset, num_workers: int = 0, batch_size: int = 32) -> dict:
    """One pass of a DataLoader over `dataset`: {num_workers, seconds, first_batch_s,
    samples_per_s}. Starting worker processes costs time once (first_batch_s includes it);
    samples_per_s is the steady rate, counted after the first batch."""
    with Checks("loader_throughput") as check:
        check.integer("num_workers", num_workers, min=0)
        check.integer("batch_size", batch_size, min=1)
    r = _timed_pass(DataLoader(dataset, batch_size=batch_size, num_workers=num_workers))
    rate = r["after_first_samples"] / r["after_first_s"] if r["after_first_s"] > 0 else r["samples"] / r["seconds"]
    return {"num_workers": num_workers, "seconds": r["seconds"], "first_batch_s": r["first_batch_s"],
            "samples_per_s": rate}


def overlapped_epoch(dataset: Dataset, compute_s: float, num_workers: int = 0, batch_size: int = 32) -> dict:
    """A training loop whose device step takes `compute_s` seconds (slept, as if a GPU ran
    it): with num_workers = 0 each batch is loaded and then computed, with workers loaded
    in the background while the step runs. Returns {num_workers, seconds, first_batch_s,
    after_first_s, batches}: after the first batch, a loop that overlaps takes about
    (batches - 1)·max(L / workers, C), one that doesn't (batches - 1)·(L + C)."""
    with Checks("overlapped_epoch") as check:
        check.number("compute_s", compute_s, min=0, why=" (seconds)")
        check.integer("num_workers", num_workers, min=0)
        check.integer("batch_size", batch_size, min=1)
    r = _timed_pass(DataLoader(dataset, batch_size=batch_size, num_workers=num_workers),
                    per_batch=lambda: time.sleep(compute_s))              # the device step
    return {"num_workers": num_workers, "seconds": r["seconds"], "first_batch_s": r["first_batch_s"],
            "after_first_s": r["after_first_s"], "batches": r["batches"]}
