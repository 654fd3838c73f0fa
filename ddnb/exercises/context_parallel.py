"""Checkers for the long-sequence and many-experts chapter (13): predict Ulysses' bytes per
rank (then measure them on real processes), implement the online-softmax merge of two
attention blocks (then run it inside ring attention on real processes), predict the
tokens a capacity factor drops. Taught in `notebooks/13_sequence_context_expert.ipynb`.
"""
from __future__ import annotations

import torch

from ddnb._checks import Checks, is_number
from ddnb.exercises.core import compare, passed, run_on_ranks


def _ulysses_measured(batch, heads, seq_len, head_dim):
    import torch.distributed as dist

    from ddnb.context_parallel import split_sequence, ulysses_attention
    from ddnb.trace import Tracer

    n, r = dist.get_world_size(), dist.get_rank()
    q, k, v = (split_sequence(torch.randn(batch, heads, seq_len, head_dim, generator=torch.Generator()
                                          .manual_seed(i)), n)[r].requires_grad_() for i in range(3))
    tracer = Tracer()
    ulysses_attention(q, k, v, causal=True, tracer=tracer).sum().backward()
    return sum(e["nbytes"] for e in tracer.take() if e["kind"] == "send" and e["name"] == "all_to_all")


def check_ulysses_bytes(predicted, batch: int = 1, heads: int = 8, seq_len: int = 64, head_dim: int = 16,
                        world_size: int = 4) -> str:
    """Your prediction of the bytes one rank sends in one Ulysses attention forward and
    backward (float32), against ulysses_bytes_per_rank and the bytes measured on
    `world_size` real processes."""
    from ddnb.context_parallel import ulysses_bytes_per_rank

    with Checks("check_ulysses_bytes") as check:
        check.rule(is_number(predicted), f"predicted={predicted!r}: write a number of bytes")
        check.positive_ints(batch=batch, heads=heads, seq_len=seq_len, head_dim=head_dim, world_size=world_size)
    measured = run_on_ranks(_ulysses_measured, world_size, batch, heads, seq_len, head_dim,
                            what="ulysses_attention")
    expected = ulysses_bytes_per_rank(batch, heads, seq_len, head_dim, world_size)
    assert all(m == expected for m in measured), f"measured {measured}, model {expected}: please report this"
    n, shard = world_size, batch * heads * (seq_len // world_size) * head_dim * 4
    hints = {4 * shard * 2: "you counted the 1/N of each shard that stays home: an all-to-all keeps it, "
                            "multiply by (N-1)/N",
             expected / 2: "that is the forward only: backward sends the same again (dO out, dq, dk, dv back)",
             expected / 4: "that is q alone: q, k, v go out and the output comes back, 4 shards",
             3 * (n - 1) / n * shard * 2: "the output's all-to-all back to sequence shards counts too (3 + 1)"}
    if predicted != expected:
        hint = next((h for v, h in hints.items() if abs(predicted - v) < 0.5), "each all-to-all sends (N-1)/N of "
                    "a rank's shard of B·H·(S/N)·D float32s; count the all-to-alls of forward and backward")
        raise AssertionError(f"predicted {predicted:g} bytes, measured {measured[0]:g} on every rank. {hint}")
    return passed("check_ulysses_bytes", f"{expected:g} bytes per rank, measured on {world_size} processes")


def _two_blocks(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=g, dtype=torch.float64) for _ in range(3))
    k2, v2 = (torch.randn(2, 3, 7, 4, generator=g, dtype=torch.float64) * 3 for _ in range(2))
    return q, k, v, k2, v2


def _ring_with(merge_fn, seed):
    """Ring attention on this process group with the learner's merge in place of ddnb's."""
    import importlib

    import torch.distributed as dist
    import torch.nn.functional as F

    from ddnb.context_parallel import ring_attention, split_sequence

    mod = importlib.import_module("ddnb.context_parallel.ring_attention")   # the module, not the function
    n, r = dist.get_world_size(), dist.get_rank()
    g = torch.Generator().manual_seed(seed)
    full = [torch.randn(1, 2, 4 * n, 3, generator=g, dtype=torch.float64) for _ in range(3)]
    saved, mod.merge = mod.merge, merge_fn
    try:
        out = ring_attention(*(split_sequence(t, n, "zigzag")[r] for t in full), causal=True, layout="zigzag")
    finally:
        mod.merge = saved
    return out, split_sequence(F.scaled_dot_product_attention(*full, is_causal=True), n, "zigzag")[r]


def check_merge(merge_fn, world_size: int = 3) -> str:
    """Your merge(out, lse, block_out, block_lse) -> (out', lse') of two partial attentions
    over disjoint key sets: first on two blocks here, against softmax over all the keys,
    then inside ring attention on `world_size` real processes (causal, zig-zag)."""
    from ddnb.context_parallel import attend_block

    with Checks("check_merge") as check:
        check.rule(callable(merge_fn), f"merge_fn={merge_fn!r}: need a function merge(out, lse, block_out, block_lse)")
        check.integer("world_size", world_size, min=1, max=8)
    q, k, v, k2, v2 = _two_blocks()
    scale = 4 ** -0.5
    o1, l1 = attend_block(q, k, v, scale, False)
    o2, l2 = attend_block(q, k2, v2, scale, False)
    want_o, want_l = attend_block(q, torch.cat([k, k2], 2), torch.cat([v, v2], 2), scale, False)
    got = merge_fn(o1, l1, o2, l2)
    if not (isinstance(got, tuple) and len(got) == 2):
        raise AssertionError("merge must return (out, lse), the merged output and log-sum-exp")
    o, lse = got
    hint = ""
    if isinstance(o, torch.Tensor) and o.shape == want_o.shape and not torch.allclose(o, want_o):
        if torch.allclose(o, (o1 + o2) / 2):
            hint = "that is the plain mean of the two outputs: weight each by exp(L_j - L'), its share of the total"
        elif torch.allclose(o, o1 * torch.exp(l1 - want_l)[..., None] + o2):
            hint = "only the first block was rescaled: both outputs need their weight exp(L_j - L')"
        else:
            hint = "L' = log(exp L + exp L_j) (torch.logaddexp), O' = exp(L - L') O + exp(L_j - L') O_j"
    compare(o, want_o, rank=0, name="merged output (two blocks, this process)", hint=hint)
    if isinstance(lse, torch.Tensor) and lse.shape == want_l.shape and torch.allclose(lse, torch.maximum(l1, l2)):
        hint = "the max of the two is not the log of the summed normalizers: use torch.logaddexp"
    compare(lse, want_l, rank=0, name="merged log-sum-exp", hint=hint)
    for rank, (out, want) in enumerate(run_on_ranks(_ring_with, world_size, merge_fn, 1, what="merge")):
        compare(out, want, rank=rank, name="ring attention output with your merge")
    return passed("check_merge", f"two blocks here, and causal zig-zag ring attention on {world_size} processes")


def check_dropped_tokens(predicted, counts=(9, 3, 2, 2), top_k: int = 1, capacity_factor: float = 1.0) -> str:
    """Your prediction of how many token assignments are dropped when a batch's assignments
    per expert are `counts` (before capacity), with capacity_factor and top_k."""
    from ddnb.expert_parallel import capacity_of

    with Checks("check_dropped_tokens") as check:
        check.rule(is_number(predicted), f"predicted={predicted!r}: write a number of assignments")
    E, assignments = len(counts), sum(counts)
    tokens = assignments // top_k
    cap = capacity_of(tokens, E, top_k, capacity_factor)
    expected = sum(max(0, c - cap) for c in counts)
    if predicted != expected:
        floor_cap = int(capacity_factor * top_k * tokens / E)
        hints = {sum(min(c, cap) for c in counts): "that is the number kept: dropped = Σ max(0, count - capacity)",
                 sum(max(0, c - floor_cap) for c in counts): "capacity is rounded up (ceil), not down",
                 sum(max(0, c - int(-(-capacity_factor * tokens // E))) for c in counts):
                     f"capacity counts every one of the top_k={top_k} choices: ceil(cf · k · T / E)"}
        hint = hints.get(predicted, f"capacity = ceil({capacity_factor} · {top_k} · {tokens} / {E}) = {cap}; "
                                    f"each expert keeps at most that many")
        raise AssertionError(f"predicted {predicted}, but {expected} are dropped (capacity {cap}). {hint}")
    return passed("check_dropped_tokens", f"capacity {cap} per expert drops {expected} of {assignments} assignments")
