"""PowerSGD, from scratch: rank-r gradient compression by one step of power iteration
(Vogels, Karimireddy & Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for
Distributed Optimization", NeurIPS 2019, Algorithm 1, with error feedback, Algorithm 2).

Each gradient tensor is viewed as a matrix M (n, m) (its first dim by the rest). Instead
of all-reducing M's n·m elements, every rank sends two thin factors:

    P = M Q              (n, r)   Q (m, r): last step's Q (warm start), or random at first
    all-reduce P         Σ_w M_w Q = (Σ_w M_w) Q: the sum is linear in M, so it all-reduces
    P̂ = orthogonalize(P)          Gram-Schmidt, column by column
    Q = Mᵀ P̂             (m, r)
    all-reduce Q, / N    Q = (1/N) Σ_w M_wᵀ P̂ = M̄ᵀ P̂
    M̄ ≈ P̂ Qᵀ            the rank-r approximation of the mean gradient M̄ = (1/N) Σ_w M_w

so (n + m)·r elements cross the network instead of n·m. Error feedback (Algorithm 2,
line "e_w ← Δ_w − decompress(...)"; Karimireddy et al. 2019): each rank adds to its
gradient what compression dropped last step, e = (M + e) − P̂ Qᵀ, so nothing is lost, only
delayed. Warm start (Sec. 3, "reuse Q"): the power iteration continues across steps from
the previous Q, so one iteration per step tracks the top singular subspace.

This follows torch's `ddp_comm_hooks.powerSGD_hook` detail for detail, so that the two are
equal within 1e-5 given the same `random_seed` (tests/test_compression.py):
- a tensor is compressed only if (n + m)·r·min_compression_rate < n·m; the others (biases,
  small matrices) are concatenated and all-reduced uncompressed, first;
- r is min(n, m, matrix_approximation_rank) per matrix; the first `start_powerSGD_iter`
  steps are a plain all-reduce (DDP rebuilds its buckets at step 1);
- error feedback covers the whole bucket, uncompressed tensors too (their errors sum to
  zero over the ranks, so it changes nothing but rounding);
- the initial Q of a bucket is torch.randn under the seed `rng.randint(1e9)` drawn from
  numpy's RandomState(random_seed), one Q per matrix in the order of the matrices grouped
  by shape; P and Q of a bucket are one flat buffer each, all-reduced in one call;
- orthogonalization: Gram-Schmidt, where torch switches to QR for r > 2 (the same columns
  up to rounding; `orthogonalization="qr"` does what torch does);
- batch_tensors_with_same_shape: same-shaped matrices stacked, one batched matmul.
One difference, asked for by ddnb's issue: a rank r ≥ the smaller side of a matrix (where
torch silently clips it, and sends more than the matrix) is refused, on every rank.

Bytes per step (compressed steps), per bucket: 4·(Σ_uncompressed numel + Σ_compressed
(n + m)·r) (`powersgd_bytes`). Taught in `notebooks/14_precision_compression.ipynb`.

    state = PowerSGDState(None, matrix_approximation_rank=4, start_powerSGD_iter=10)
    ddp.register_comm_hook(state, powersgd_hook)
"""
from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import torch
import torch.distributed as dist

from ddnb._checks import Checks
from ddnb.compression.comm import allreduce, done
from ddnb.trace import Tracer


class PowerSGDState:
    """PowerSGD's settings and memory (torch's `PowerSGDState`, same arguments and
    defaults, plus `tracer` and `orthogonalization`): per bucket index, the error e
    (numel,), and the flat P and Q memories; `iter` counts steps (the last bucket ends one)."""

    def __init__(self, process_group=None, matrix_approximation_rank: int = 1, start_powerSGD_iter: int = 1_000,
                 min_compression_rate: float = 2, use_error_feedback: bool = True, warm_start: bool = True,
                 orthogonalization_epsilon: float = 0, random_seed: int = 0,
                 batch_tensors_with_same_shape: bool = False, tracer: Tracer | None = None,
                 orthogonalization: str = "gram_schmidt"):
        with Checks("PowerSGDState") as check:
            check.integer("matrix_approximation_rank", matrix_approximation_rank, min=1)
            if check.integer("start_powerSGD_iter", start_powerSGD_iter, min=0):
                check.rule(not (use_error_feedback or warm_start) or start_powerSGD_iter > 1,
                           f"start_powerSGD_iter={start_powerSGD_iter}: need > 1 with error feedback or warm "
                           "start (DDP rebuilds its buckets at step 1), as torch's PowerSGDState")
            check.number("min_compression_rate", min_compression_rate, positive=True)
            check.number("orthogonalization_epsilon", orthogonalization_epsilon, min=0)
            check.integer("random_seed", random_seed, min=0)
            check.choice("orthogonalization", orthogonalization, ("gram_schmidt", "qr"))
        self.process_group, self.matrix_approximation_rank = process_group, matrix_approximation_rank
        self.start_powerSGD_iter, self.min_compression_rate = start_powerSGD_iter, min_compression_rate
        self.use_error_feedback, self.warm_start = use_error_feedback, warm_start
        self.orthogonalization_epsilon, self.orthogonalization = orthogonalization_epsilon, orthogonalization
        self.batch_tensors_with_same_shape, self.tracer = batch_tensors_with_same_shape, tracer
        self.rng = np.random.RandomState(random_seed)
        self.error_dict: dict[int, torch.Tensor] = {}
        self.p_memory_dict: dict[int, torch.Tensor] = {}
        self.q_memory_dict: dict[int, torch.Tensor] = {}
        self.iter = 0

    def advance(self, bucket) -> None:
        if bucket.is_last():
            self.iter += 1


def gram_schmidt(matrices: torch.Tensor, epsilon: float = 0) -> torch.Tensor:
    """Orthonormalize the columns of each matrix of the batch (B, n, r), in place (modified
    Gram-Schmidt: normalize column i, remove its component from columns i+1..r-1)."""
    for i in range(matrices.shape[2]):
        col = matrices[:, :, i:i + 1]                                     # (B, n, 1)
        col /= torch.norm(col, dim=1, keepdim=True) + epsilon
        if i + 1 < matrices.shape[2]:
            rest = matrices[:, :, i + 1:]                                 # (B, n, r-i-1)
            rest -= torch.sum(col * rest, dim=1, keepdim=True) * col
    return matrices


def orthogonalize(matrices: torch.Tensor, epsilon: float = 0, how: str = "gram_schmidt") -> torch.Tensor:
    """Orthonormal columns for each (n, r) matrix of the batch (B, n, r), in place: Gram-Schmidt,
    or (how="qr", r > 2, as torch's hook) Householder QR's Q."""
    r = matrices.shape[2]
    if how == "qr" and r > 2 and matrices.dtype not in (torch.float16, torch.bfloat16):
        torch.linalg.qr(matrices, out=(matrices, torch.empty(matrices.shape[0], r, r, dtype=matrices.dtype,
                                                              device=matrices.device)))
        return matrices
    return gram_schmidt(matrices, epsilon)


def compressed(n: int, m: int, rank: int, min_compression_rate: float) -> bool:
    """Whether an (n, m) matrix is worth compressing at rank r = min(n, m, rank): when
    (n + m)·r · min_compression_rate < n·m (torch's `_should_compress`)."""
    return (n + m) * min(n, m, rank) * min_compression_rate < n * m


def check_rank(shapes, rank: int, names=None, where: str = "powersgd") -> None:
    """ValueError naming every tensor of 2 dims or more whose matrix view (shape[0], rest)
    has a smaller side <= rank: a rank-r factorization of it sends (n + m)·r >= n·m elements."""
    with Checks(where) as check:
        if check.integer("rank", rank, min=1):
            for i, shape in enumerate(shapes):
                if len(shape) >= 2:
                    n, m = shape[0], math.prod(shape[1:])
                    check.rule(rank < min(n, m), f"rank={rank} >= the smaller side {min(n, m)} of "
                               f"{names[i] if names else f'tensor {i}'} {tuple(shape)} (as a {n}x{m} matrix): "
                               f"rank r sends (n+m)·r = {(n + m) * rank} >= n·m = {n * m} elements")


def powersgd_bytes(shapes, rank: int, min_compression_rate: float = 2, element_size: int = 4) -> int:
    """Bytes one bucket of tensors of these `shapes` hands to its three all-reduces in a
    compressed step: element_size · (Σ_uncompressed numel + Σ_compressed (n + m)·r)."""
    check_rank(shapes, rank, where="powersgd_bytes")
    total = 0
    for shape in shapes:
        n = shape[0] if len(shape) else 1
        m = math.prod(shape[1:]) if len(shape) > 1 else 1
        total += (n + m) * min(n, m, rank) if compressed(n, m, rank, min_compression_rate) else n * m
    return total * element_size


def _split(tensors, rank, min_compression_rate):
    """(matrices to compress (n, m) views, uncompressed tensors, P numel, Q numel)."""
    matrices, rest, p_size, q_size = [], [], 0, 0
    for t in tensors:
        matrix = t.view(t.shape[0], -1)                                   # (n, m), a view into the bucket
        n, m = matrix.shape
        if compressed(n, m, rank, min_compression_rate):
            r = min(n, m, rank)
            matrices.append(matrix)
            p_size, q_size = p_size + n * r, q_size + m * r
        else:
            rest.append(t)
    return matrices, rest, p_size, q_size


def powersgd_hook(state: PowerSGDState, bucket):   # -> Future[Tensor] (unannotated: DDP checks annotations)
    """A DDP communication hook: the bucket's gradients, averaged over the ranks through
    PowerSGD (see the module docstring); returns a completed future of the buffer."""
    group = state.process_group
    n_ranks = dist.get_world_size(group)
    buffer, k = bucket.buffer(), bucket.index()                           # (numel,)
    fields = dict(method="powersgd", step=state.iter, bucket=k)
    if state.iter < state.start_powerSGD_iter:                            # plain all-reduce first
        allreduce(buffer.div_(n_ranks), group, state.tracer, "powersgd: vanilla all-reduce", **fields)
        state.advance(bucket)
        return done(buffer)
    tensors = bucket.gradients()
    check_rank([t.shape for t in tensors], state.matrix_approximation_rank)   # same shapes: every rank raises
    local = None
    if state.use_error_feedback:                                          # M_w + e_w
        if k in state.error_dict:
            buffer.add_(state.error_dict[k])
        else:
            state.error_dict[k] = torch.zeros_like(buffer)
        local = buffer.clone()
    matrices, rest, p_size, q_size = _split(tensors, state.matrix_approximation_rank, state.min_compression_rate)
    fresh = not state.warm_start or k not in state.p_memory_dict
    if fresh:
        state.p_memory_dict[k] = torch.empty(p_size, dtype=buffer.dtype, device=buffer.device)
        state.q_memory_dict[k] = torch.empty(q_size, dtype=buffer.dtype, device=buffer.device)
    by_shape = defaultdict(list)                                          # the order torch draws Q in
    for mat in matrices:
        by_shape[mat.shape].append(mat)
    batches = []                                                          # (B, n, m) each
    for same in by_shape.values():
        if state.batch_tensors_with_same_shape and len(same) > 1:
            batches.append(torch.stack(same))                             # a copy, written back at the end
        else:
            batches += [mat.unsqueeze(0) for mat in same]
    ps, qs, pi, qi = [], [], 0, 0
    for mats in batches:
        b, n, m = mats.shape
        r = min(n, m, state.matrix_approximation_rank)
        ps.append(state.p_memory_dict[k][pi:pi + b * n * r].view(b, n, r))   # (B, n, r)
        qs.append(state.q_memory_dict[k][qi:qi + b * m * r].view(b, m, r))   # (B, m, r)
        pi, qi = pi + b * n * r, qi + b * m * r
    eps, how = state.orthogonalization_epsilon, state.orthogonalization
    if fresh:                                                             # Q random, orthonormal
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(state.rng.randint(1_000_000_000))
            for q in qs:
                q.copy_(torch.randn(*q.shape, device="cpu", dtype=buffer.dtype))
                orthogonalize(q, eps, how)
    else:                                                                 # warm start: last step's Q
        for q in qs:
            orthogonalize(q, eps, how)
    for mats, q, p in zip(batches, qs, ps):
        torch.bmm(mats, q, out=p)                                         # P = M Q
    flat = torch.cat([t.view(-1) for t in rest]) if rest else buffer.new_empty(0)
    allreduce(flat, group, state.tracer, "powersgd: uncompressed", **fields)
    flat.div_(n_ranks)
    offset = 0
    for t in rest:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()
    allreduce(state.p_memory_dict[k], group, state.tracer, "powersgd: P", **fields)   # Σ_w M_w Q
    for p in ps:
        orthogonalize(p, eps, how)                                        # P̂
    for mats, p, q in zip(batches, ps, qs):
        torch.bmm(mats.transpose(1, 2), p, out=q)                         # Q = Mᵀ P̂
    allreduce(state.q_memory_dict[k], group, state.tracer, "powersgd: Q", **fields)
    state.q_memory_dict[k].div_(n_ranks)                                  # Q = M̄ᵀ P̂
    for p, q, mats in zip(ps, qs, batches):
        torch.bmm(p, q.transpose(1, 2), out=mats)                         # M̄ ≈ P̂ Qᵀ
    for mats in batches:
        if mats.shape[0] > 1:                                             # stacked: copy back
            for i, original in enumerate(by_shape[mats.shape[1:]]):
                original.copy_(mats[i])
    if state.use_error_feedback:
        state.error_dict[k] = local - buffer                              # e_w = (M_w + e_w) − P̂ Qᵀ
    if not state.warm_start:
        state.p_memory_dict.clear()
        state.q_memory_dict.clear()
    state.advance(bucket)
    return done(buffer)


def compare_with_hooks(by_hand, n: int = 32, m: int = 24, r: int = 2) -> tuple[float, float]:
    """Check a PowerSGD step written by hand against the hooks, one matrix on every rank:
    `by_hand(n, m, r)` returns (its rank-r approximation of the mean gradient (n, m), this
    rank's gradient M (n, m)); the same M then goes, as a one-tensor bucket, through
    `powersgd_hook` and torch's `powerSGD_hook` at a compressed step (state.iter = 2, the
    first Q drawn from the seed both hooks draw). Call it on every rank at once.
    Returns (largest |by hand − ddnb's hook|, largest |ddnb's − torch's hook|).
    Used by `notebooks/14_precision_compression.ipynb` ("PowerSGD, step by step")."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_psgd

    from ddnb.compression.comm import Bucket

    with Checks("compare_with_hooks") as check:
        check.rule(callable(by_hand), f"by_hand must be a function, got {type(by_hand).__name__}")
        check.positive_ints(n=n, m=m, r=r)
        check.rule(not all(isinstance(v, int) for v in (n, m, r)) or r < min(n, m),
                   f"r={r} must be below min(n, m) = min({n}, {m})")
    mine, M = by_hand(n, m, r)                                        # (n, m), (n, m)
    out = []
    for state, hook in ((PowerSGDState(None, r, start_powerSGD_iter=2), powersgd_hook),
                        (torch_psgd.PowerSGDState(None, r, start_powerSGD_iter=2), torch_psgd.powerSGD_hook)):
        state.iter = 2                                                # past the plain all-reduce steps
        g = M.clone()
        out.append(hook(state, Bucket(0, g.view(-1), [g])).wait().view(n, m))
    return (mine - out[0]).abs().max().item(), (out[0] - out[1]).abs().max().item()
