"""Ring attention: context parallelism that never holds the whole sequence's keys and values.

Each of the N ranks of `group` holds a shard of the sequence: its queries, keys and values
q, k, v of shape (B, H, S/N, D). Attention needs every query against every key, so the K/V
shards travel around the ring (Liu, Zaharia & Abbeel 2023, "Ring Attention with Blockwise
Transformers for Near-Infinite Context", arXiv 2310.01889, Sec. 3 and Alg. 1): in step
s = 0..N-1 rank r attends its queries to the K/V block of rank (r - s) mod N, while the
block for step s+1 is already on its way from rank r-1 (posted before the compute: the
messages overlap the attention). The partial results are merged by the online softmax
(Milakov & Gimelshein 2018; FlashAttention, Dao et al. 2022, Sec. 3.1) kept as an output
O and a log-sum-exp L per query row:

    block j:   S_j = q K_jᵀ · scale,  L_j = logsumexp(S_j),  O_j = softmax(S_j) V_j
    merge:     L' = log(exp L + exp L_j),  O' = exp(L - L') O + exp(L_j - L') O_j     (Eq. 1)

which equals softmax over the concatenated keys exactly (the weights exp(L - L') and
exp(L_j - L') rescale each part to the common normalizer).

Causal attention and balance. With contiguous shards (rank r holds positions
[r·S/N, (r+1)·S/N)) rank r needs only the blocks of ranks <= r: rank 0 computes 1 block,
rank N-1 computes N, and everyone waits for the last. Zig-zag sharding (the Ultra-Scale
Playbook's "zig-zag ring attention"; Brandon et al. 2023, "Striped Attention", arXiv
2311.09431, balance by a different permutation) cuts the sequence into 2N chunks and
gives rank r chunks r and 2N-1-r: an early and a late one. Then in every step after the
first each rank computes exactly two (S/2N)² sub-blocks, and in step 0 three: (2N+1)(S/2N)²
scores on every rank, against (r+1)(S/N)² on rank r with contiguous shards. `ring_work`
counts it from `block_plan`, the plain list of sub-blocks that forward, backward and the
count all read.

Backward (`_RingAttention.backward`, FlashAttention-2's backward per block, Dao 2023,
Alg. 2): with D = rowsum(dO ∘ O) and P_j = exp(S_j - L),

    dV_j += P_jᵀ dO,   dS_j = P_j ∘ (dO V_jᵀ - D),   dq += dS_j K_j · scale,   dK_j += dS_jᵀ q · scale

dq stays home; K/V go around the ring again (overlapped as in forward) and the dK/dV
accumulators travel *with* them: after its N-th step each accumulator is one hop from
the rank that owns the block, and one last exchange brings it home. Messages per rank:
forward N-1 K/V blocks, backward N-1 K/V blocks and N dK/dV blocks, each 2·B·H·(S/N)·D
elements (`ring_bytes_per_rank`).

torch's own `torch.distributed.tensor.experimental.context_parallel` (torch 2.13) does
not run on CPU / gloo, so it is not compared here: it shards the buffers over a DeviceMesh
and dispatches F.scaled_dot_product_attention to DTensor ring kernels registered only for
the fused CUDA ops (flash / efficient / cudnn attention); on CPU the call becomes
aten._scaled_dot_product_flash_attention_for_cpu, which "does not have a sharding
strategy registered" (NotImplementedError, recorded by
tests/test_ring_attention.py::test_torch_context_parallel_on_cpu on 2 gloo ranks).
Taught in `notebooks/13_sequence_context_expert.ipynb`.
"""
from __future__ import annotations

import math

import torch

from ddnb._checks import Checks
from ddnb.collectives.p2p import Op, group_rank, group_size, post
from ddnb.context_parallel.agree import agree, check_qkv, dtype_code
from ddnb.trace import Tracer, get_tracer

LAYOUTS = ("contiguous", "zigzag")


# ----------------------------------------------------------------------------- sharding
def chunks_of(rank: int, world_size: int, layout: str) -> list[int]:
    """The global chunk indices rank holds, in order: [rank] of N chunks (contiguous) or
    [rank, 2N-1-rank] of 2N chunks (zig-zag)."""
    return [rank] if layout == "contiguous" else [rank, 2 * world_size - 1 - rank]


def _check_split(check: Checks, seq_len, world_size: int, layout) -> None:
    if check.choice("layout", layout, LAYOUTS) and check.integer("world_size", world_size, min=1):
        parts = world_size * (1 if layout == "contiguous" else 2)
        check.rule(seq_len % parts == 0, f"sequence length {seq_len} is not divisible by "
                   f"{'N' if layout == 'contiguous' else '2N'}={parts} (world_size={world_size}, {layout} layout: "
                   f"{parts} equal chunks)")


def split_sequence(x: torch.Tensor, world_size: int, layout: str = "contiguous", dim: int = 2) -> list[torch.Tensor]:
    """The world_size shards of x along `dim` (the sequence), shard r for rank r: contiguous
    (S/N positions each) or zig-zag (chunks r and 2N-1-r of 2N). ValueError naming S and N
    when the sequence does not split evenly."""
    with Checks("split_sequence") as check:
        if check.rule(isinstance(x, torch.Tensor), f"x must be a tensor, got {type(x).__name__}"):
            check.rule(-x.dim() <= dim < x.dim(), f"dim={dim} is not a dim of x (shape {tuple(x.shape)})")
            if -x.dim() <= dim < x.dim():
                _check_split(check, x.shape[dim], world_size, layout)
    pieces = x.chunk(world_size * (1 if layout == "contiguous" else 2), dim=dim)
    return [torch.cat([pieces[c] for c in chunks_of(r, world_size, layout)], dim=dim)
            for r in range(world_size)]


def gather_sequence(shards: list[torch.Tensor], layout: str = "contiguous", dim: int = 2) -> torch.Tensor:
    """The inverse of `split_sequence`: the full tensor from the N shards."""
    n = len(shards)
    if layout == "contiguous":
        return torch.cat(shards, dim=dim)
    halves = [s.chunk(2, dim=dim) for s in shards]
    order = [halves[c][0] if c < n else halves[2 * n - 1 - c][1] for c in range(2 * n)]
    return torch.cat(order, dim=dim)


# ----------------------------------------------------------------------------- the plan
def block_plan(rank: int, src: int, world_size: int, shard_len: int, layout: str, causal: bool):
    """The sub-blocks rank computes against the K/V shard of rank `src`: a list of
    (q rows, k rows, masked) with rows as (start, stop) within the shards. Not causal: one
    block, everything. Causal: chunk pairs with the key chunk before the query chunk
    (full), the same chunk (masked: lower triangle), never after (skipped)."""
    if not causal:
        return [((0, shard_len), (0, shard_len), False)]
    c = shard_len // len(chunks_of(rank, world_size, layout))
    plan = []
    for i, qc in enumerate(chunks_of(rank, world_size, layout)):
        for j, kc in enumerate(chunks_of(src, world_size, layout)):
            if kc <= qc:
                plan.append(((i * c, (i + 1) * c), (j * c, (j + 1) * c), kc == qc))
    return plan


def ring_work(world_size: int, seq_len: int, causal: bool = True, layout: str = "contiguous") -> list[int]:
    """Attention scores (query-key pairs) each rank computes in one forward, in rank order,
    from `block_plan`: with contiguous causal shards rank r computes (r+1)(S/N)²; zig-zag
    gives every rank (2N+1)(S/2N)²."""
    with Checks("ring_work") as check:
        _check_split(check, seq_len, world_size, layout)
    shard = seq_len // world_size
    return [sum((q1 - q0) * (k1 - k0) for src in range(world_size)
                for (q0, q1), (k0, k1), _ in block_plan(r, src, world_size, shard, layout, causal))
            for r in range(world_size)]


def ring_bytes_per_rank(batch: int, heads: int, seq_len: int, head_dim: int, world_size: int,
                        element_size: int = 4, backward: bool = True) -> int:
    """Bytes one rank sends in one ring-attention forward (+ backward): K/V blocks of
    2·B·H·(S/N)·D elements, N-1 of them forward, N-1 plus N dK/dV blocks backward."""
    block = 2 * batch * heads * (seq_len // world_size) * head_dim * element_size
    n = world_size
    return (n - 1) * block + ((n - 1) + n) * block * backward if n > 1 else 0


# ----------------------------------------------------------------------------- one block
def scores(q, k, scale: float, masked: bool):
    """S = q kᵀ · scale (B, H, m, n), -inf above the diagonal when masked (m == n, the
    same positions: a query sees itself and the keys before it)."""
    s = q @ k.transpose(-2, -1) * scale                                 # (B, H, m, n)
    if masked:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril(), float("-inf"))
    return s


def attend_block(q, k, v, scale: float, masked: bool):
    """Attention of q (B, H, m, D) to k, v (B, H, n, D) alone: (O (B, H, m, D), L (B, H, m)),
    the block's output and log-sum-exp. masked: the lower triangle only (m == n, the same
    positions)."""
    s = scores(q, k, scale, masked)                                     # (B, H, m, n)
    lse = torch.logsumexp(s, dim=-1)                                    # (B, H, m)
    return torch.exp(s - lse.unsqueeze(-1)) @ v, lse                    # (B, H, m, D), (B, H, m)


def merge(out, lse, block_out, block_lse):
    """The online-softmax merge of two partial attentions over disjoint key sets (Eq. 1):
    (O, L) and (O_j, L_j) -> (O', L'), new tensors. L = -inf (no keys yet) is fine."""
    new = torch.logaddexp(lse, block_lse)                               # (B, H, m)
    return (out * torch.exp(lse - new).unsqueeze(-1)
            + block_out * torch.exp(block_lse - new).unsqueeze(-1)), new


def _rows(t, rows):
    return t[..., rows[0]:rows[1], :]


def _rotate(kv, rank, n, group, tracer, tag, name):
    """Post: send kv to rank+1, receive the next block from rank-1. (buffer, pendings)."""
    nxt = torch.empty_like(kv)
    return nxt, post([Op("send", kv, (rank + 1) % n, tag=tag, name=name),
                      Op("recv", nxt, (rank - 1) % n, tag=tag, name=name)], group, tracer)


def around_the_ring(kv, rank, n, group, tracer):
    """Yield (step, src, the K/V block of rank src) for step 0..N-1: before each yield the
    block for the next step is already posted (send to rank+1, receive from rank-1), and
    it is waited for only after the caller's computation on this one: the overlap."""
    for step in range(n):
        nxt, pending = _rotate(kv, rank, n, group, tracer, 0, "ring kv") if step < n - 1 else (None, [])
        yield step, (rank - step) % n, kv
        for p in pending:
            p.wait()
        kv = nxt


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, causal, layout, scale, tracer):   # (B, H, S/N, D) each
        rank, n, tr = group_rank(group), group_size(group), get_tracer(tracer)
        out, lse = torch.zeros_like(q), q.new_full(q.shape[:-1], float("-inf"))   # (B,H,S/N,D), (B,H,S/N)
        kv = torch.stack([k, v])                                        # (2, B, H, S/N, D): one message
        for step, src, kv in around_the_ring(kv, rank, n, group, tracer):
            for qr, kr, masked in block_plan(rank, src, n, q.shape[-2], layout, causal):
                with tr.span("compute", "attention block", src=src, step=step, q_rows=qr[1] - qr[0],
                             k_rows=kr[1] - kr[0], phase="forward"):
                    o, l = attend_block(_rows(q, qr), _rows(kv[0], kr), _rows(kv[1], kr), scale, masked)
                    o, l = merge(_rows(out, qr), lse[..., qr[0]:qr[1]], o, l)
                    out[..., qr[0]:qr[1], :], lse[..., qr[0]:qr[1]] = o, l
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = group, causal, layout, scale, tracer
        return out

    @staticmethod
    def backward(ctx, grad_out):                                        # (B, H, S/N, D)
        q, k, v, out, lse = ctx.saved_tensors
        group, causal, layout, scale, tracer = ctx.args
        rank, n, tr = group_rank(group), group_size(group), get_tracer(tracer)
        grad_out = grad_out.contiguous()
        delta = (grad_out * out).sum(-1)                                # (B, H, S/N): D = rowsum(dO ∘ O)
        dq, kv = torch.zeros_like(q), torch.stack([k, v])               # (B,H,S/N,D), (2,B,H,S/N,D)
        dkv = torch.zeros_like(kv)                                      # travels with kv
        for step, src, kv in around_the_ring(kv, rank, n, group, tracer):
            for qr, kr, masked in block_plan(rank, src, n, q.shape[-2], layout, causal):
                with tr.span("compute", "attention block", src=src, step=step, q_rows=qr[1] - qr[0],
                             k_rows=kr[1] - kr[0], phase="backward"):
                    qb, kb, vb, dob = _rows(q, qr), _rows(kv[0], kr), _rows(kv[1], kr), _rows(grad_out, qr)
                    p = torch.exp(scores(qb, kb, scale, masked) - lse[..., qr[0]:qr[1]].unsqueeze(-1))                    # (B, H, m, n)
                    ds = p * (dob @ vb.transpose(-2, -1) - delta[..., qr[0]:qr[1]].unsqueeze(-1))
                    _rows(dkv[1], kr).add_(p.transpose(-2, -1) @ dob)
                    _rows(dkv[0], kr).add_(ds.transpose(-2, -1) @ qb * scale)
                    _rows(dq, qr).add_(ds @ kb * scale)
            if n > 1:                                                   # dK/dV follow their block
                dkv_next, sent = _rotate(dkv, rank, n, group, tracer, 1, "ring dkv")
                for p in sent:
                    p.wait()
                dkv = dkv_next
        return dq, dkv[0], dkv[1], None, None, None, None, None


def problems(q, k, v, causal, layout) -> list[str]:
    """Every problem of one rank's arguments ([] when valid)."""
    check = Checks()
    if check_qkv(check, q, k, v):
        check.rule(q.shape[2] >= 1, "the shard holds no positions (seq/N = 0)")
        if layout == "zigzag":
            check.rule(q.shape[2] % 2 == 0, f"a zig-zag shard holds two equal chunks: its length {q.shape[2]} "
                       f"must be even (the sequence length divisible by 2N)")
    check.rule(isinstance(causal, bool), f"causal={causal!r}: need True or False")
    check.choice("layout", layout, LAYOUTS)
    return check.problems


def call_fields(q, causal, layout, found) -> dict[str, int]:
    """What every rank's call must agree on, as integers (zeros when this rank's arguments
    are bad: only its problems count then)."""
    names = ("batch", "heads", "shard length", "head_dim", "dtype", "causal", "layout")
    if found:
        return dict.fromkeys(names, 0)
    return dict(zip(names, (*q.shape, dtype_code(q.dtype), int(causal), LAYOUTS.index(layout))))


def ring_attention(q, k, v, group=None, causal: bool = False, layout: str = "contiguous",
                   scale: float | None = None, tracer: Tracer | None = None, check: bool = True):
    """This rank's attention output (B, H, S/N, D) for its sequence shard q, k, v (each
    (B, H, S/N, D); shard r as `split_sequence(x, N, layout)[r]` gives it), equal to
    F.scaled_dot_product_attention(Q, K, V, is_causal=causal) on the whole sequence,
    rows of this shard; differentiable (backward rings dK/dV home). layout:
    "contiguous" or "zigzag" (balanced causal work). scale: default 1/sqrt(D).
    check: first agree with the other ranks that every argument is valid and the shards
    fit (one small header each, `agree`), so a bad one raises on every rank."""
    found = problems(q, k, v, causal, layout)
    if check:
        agree("ring_attention", found, call_fields(q, causal, layout, found), group, tracer)
    elif found:
        raise ValueError(f"ring_attention on rank {group_rank(group)}: " + "; ".join(found))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return _RingAttention.apply(q, k, v, group, causal, layout, scale, tracer)
