"""Top-k sparsification with error feedback: send only the k largest-magnitude entries of
each bucket, keep the rest for later (Stich, Cordonnier & Jaggi, "Sparsified SGD with
Memory", NeurIPS 2018, Algorithm 1; Lin et al., "Deep Gradient Compression", ICLR 2018,
Sec. 3.1 "gradient sparsification" with local accumulation).

On every rank w, per bucket (flat, (numel,)):

    a = g_w + e_w                     the gradient plus what was not sent before (memory)
    S = top_k(|a|)                    the k indices of largest |a|
    send (S, a[S])                    k indices (int32) and k values (fp32): 8k bytes
    e_w = a − a[S] on S, a elsewhere  the error feedback: what was dropped waits its turn
    ĝ = (1/N) Σ_w scatter(S_w, a_w[S_w])    every rank adds up every rank's pairs

Why an all-gather and not an all-reduce: an all-reduce sums tensors element by element,
position i with position i, so every rank must send the same positions. Each rank's top-k
indices are its own (S_w differ), so the pairs of rank w cannot be added to rank v's as
they travel: summing (index, value) pairs element-wise adds indices too. Densifying them
first (zeros elsewhere) would send all numel elements again. So every rank gathers all
N·k pairs (an all-gather: N-1 times k pairs received per rank, which grows with N, unlike
an all-reduce) and scatter-adds them itself. Bytes this rank hands to the collectives per
bucket and step: 4k (indices) + 4k (values) = 8k (`topk_bytes`); the dense all-reduce
hands 4·numel, so the ratio is numel / (2k): 50× at k = 1%.

With k = numel nothing is dropped (e = 0) and the result equals the uncompressed mean
(tested bit for bit on 2 ranks). Taught in `notebooks/14_precision_compression.ipynb`.

    state = TopKState(ratio=0.01)            # or k=100 per bucket
    ddp.register_comm_hook(state, topk_hook)
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ddnb._checks import Checks
from ddnb.compression.comm import allgather, done
from ddnb.trace import Tracer


class TopKState:
    """Top-k's settings and memory: `k` entries per bucket, or a `ratio` of each bucket's
    numel (k = ceil(ratio · numel)); the error e (numel,) per bucket index."""

    def __init__(self, process_group=None, ratio: float | None = None, k: int | None = None,
                 use_error_feedback: bool = True, tracer: Tracer | None = None):
        with Checks("TopKState") as check:
            check.rule((ratio is None) != (k is None), f"give one of ratio={ratio!r} and k={k!r}")
            check.number("ratio", ratio, positive=True, max=1, none=True, why=" (a fraction of each bucket)")
            check.integer("k", k, min=1, none=True, why=" (entries sent per bucket)")
        self.process_group, self.ratio, self.k = process_group, ratio, k
        self.use_error_feedback, self.tracer = use_error_feedback, tracer
        self.error_dict: dict[int, torch.Tensor] = {}
        self.iter = 0

    def k_for(self, numel: int) -> int:
        """Entries sent from a bucket of `numel` elements; k > numel is refused."""
        k = self.k if self.k is not None else max(1, math.ceil(self.ratio * numel))
        if k > numel:
            raise ValueError(f"TopKState: k={k} > the bucket's {numel} elements")
        return k


def topk_compress(a: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(indices (k,) int32, values (k,)) of the k entries of the flat `a` largest in magnitude."""
    with Checks("topk_compress") as check:
        check.integer("k", k, min=1, max=a.numel(), why=f" (entries of a tensor of {a.numel()})")
    idx = torch.topk(a.abs(), k, sorted=False).indices                   # (k,) int64
    return idx.to(torch.int32), a[idx]


def topk_decompress(indices: torch.Tensor, values: torch.Tensor, numel: int) -> torch.Tensor:
    """The sum of every rank's sparse pairs as a dense (numel,) tensor: indices, values
    (N, k), rank by rank (the order an all-reduce adds them in, for N = 2 exactly)."""
    out = torch.zeros(numel, dtype=values.dtype, device=values.device)
    for idx, val in zip(indices, values):                                # rank 0, 1, ...
        out.index_add_(0, idx.long(), val)
    return out


def topk_bytes(k: int) -> int:
    """Bytes a rank hands to the all-gathers per bucket and step: k int32 indices + k fp32 values."""
    return 8 * k


def topk_hook(state: TopKState, bucket):   # -> Future[Tensor] (unannotated: DDP checks annotations)
    """A DDP communication hook: the mean over the ranks of every rank's top-k entries."""
    group, buffer, b = state.process_group, bucket.buffer(), bucket.index()   # buffer (numel,)
    k = state.k_for(buffer.numel())                                      # the same on every rank
    fields = dict(method="topk", step=state.iter, bucket=b)
    if state.use_error_feedback:
        if b in state.error_dict:
            buffer.add_(state.error_dict[b])                             # a = g + e
    idx, val = topk_compress(buffer, k)                                  # (k,), (k,)
    if state.use_error_feedback:
        err = buffer.clone()
        err[idx.long()] = 0                                              # e = a − sent
        state.error_dict[b] = err
    all_idx = allgather(idx, group, state.tracer, "topk: indices", **fields)     # (N, k)
    all_val = allgather(val, group, state.tracer, "topk: values", **fields)      # (N, k)
    buffer.copy_(topk_decompress(all_idx, all_val, buffer.numel())).div_(dist.get_world_size(group))
    if bucket.is_last():
        state.iter += 1
    return done(buffer)
