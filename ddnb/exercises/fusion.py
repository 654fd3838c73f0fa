"""Checker for Horovod's tensor fusion, written by hand (07): pack gradients into buffers of
at most `threshold` bytes, one all-reduce per buffer, unpack (Sergeev & Del Balso 2018,
"Horovod: fast and easy distributed deep learning in TensorFlow", Sec. 4, Tensor Fusion).
Run on real processes: the averages must be exact and the number of all-reduces the greedy
packing's, counted by wrapping `dist.all_reduce` on each rank.
Taught in `notebooks/07_horovod.ipynb`.

    check_fusion(my_fused_allreduce)     # my_fused_allreduce(tensors, threshold) -> averaged tensors
"""
from __future__ import annotations

import torch

from ddnb._checks import Checks
from ddnb.exercises.core import compare, passed, run_on_ranks

SIZES = (8192, 128, 1280, 10, 4000, 3, 600, 64)     # elements: an MLP's gradients, small and large mixed


def buffers(nbytes: list[int], threshold: int) -> list[list[int]]:
    """The greedy packing, in order: a tensor joins the open buffer while the buffer stays
    within `threshold` bytes, else it opens a new one (a tensor over the threshold travels
    alone; threshold 0 turns fusion off)."""
    out, size = [], 0
    for i, b in enumerate(nbytes):
        if out and size + b <= threshold:
            out[-1].append(i)
            size += b
        else:
            out.append([i])
            size = b
    return out


def _inputs(rank: int) -> list[torch.Tensor]:
    return [torch.arange(n, dtype=torch.float32) * 0.5 + 100.0 * (rank + 1) for n in SIZES]


def _run(fn, threshold: int):
    import torch.distributed as dist

    calls = []
    real = dist.all_reduce

    def counted(tensor, *args, **kwargs):
        calls.append(tensor.numel() * tensor.element_size())
        return real(tensor, *args, **kwargs)

    dist.all_reduce = counted
    try:
        out = fn(_inputs(dist.get_rank()), threshold)
    finally:
        dist.all_reduce = real
    return out, calls


def check_fusion(fn, world_sizes=(3, 4), thresholds=(0, 16 << 10, 64 << 20), timeout: float = 30) -> str:
    """Run `fn(tensors, threshold)` on real processes (each world size, each threshold in
    bytes): `tensors` is this rank's list of float32 gradients of mixed sizes; fn returns
    the list of their averages over the ranks, computed with one `dist.all_reduce` per
    fusion buffer. Checks the values (every rank, every tensor) and the all-reduce count
    and bytes against the greedy packing."""
    with Checks("check_fusion") as check:
        check.rule(callable(fn), f"fn={fn!r}: need a function fn(tensors, threshold) returning a list of tensors")
        check.rule(all(isinstance(n, int) and 2 <= n <= 8 for n in world_sizes), f"world_sizes={world_sizes!r}: 2..8")
    for n in world_sizes:
        expected = [sum(t) / n for t in zip(*[_inputs(r) for r in range(n)])]
        for threshold in thresholds:
            got = run_on_ranks(_run, n, fn, threshold, what=getattr(fn, "__name__", "fn"), timeout=timeout)
            want = buffers([t.numel() * 4 for t in expected], threshold)
            for rank, (out, calls) in enumerate(got):
                if not isinstance(out, (list, tuple)) or len(out) != len(expected):
                    raise AssertionError(f"rank {rank} returned {type(out).__name__}: return a list of "
                                         f"{len(expected)} tensors, the averages in the order given")
                for i, (g, e) in enumerate(zip(out, expected)):
                    compare(g, e, rank=rank, name=f"tensor {i} ({e.numel()} elements), threshold {threshold} B",
                            hint="the average: sum over ranks / world size, unpacked from its buffer at its offset")
                if len(calls) != len(want):
                    raise AssertionError(
                        f"rank {rank}, threshold {threshold} B: {len(calls)} all-reduce(s), the greedy packing makes "
                        f"{len(want)} buffers {want}: fill a buffer in order while it stays within the threshold, "
                        f"then all-reduce it once (threshold 0: one per tensor)")
    return passed("check_fusion", f"averages exact and one all-reduce per buffer on {list(world_sizes)} processes, "
                                  f"thresholds {list(thresholds)} B")
