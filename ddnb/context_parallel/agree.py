"""One check before the first message of a context- or expert-parallel layer: every rank's
problems and the sizes its call depends on, swapped in one small header per rank, so
that a bad argument on any rank (or ranks whose shards do not fit together) raises the
same ValueError on *every* rank instead of leaving the others blocked in a receive.

    agree("ring_attention", found, {"batch": B, "heads": H, "shard": S, ...}, group)

`found` is this rank's list of problems (sentences; [] when its arguments are valid);
`fields` the integers that must be equal on every rank. The header travels with
`ddnb.collectives.ops.share_rows` (gather at group rank 0, table sent back: 2 rounds,
traced as "check"), as the from-scratch collectives' own checks do. A group of one
rank sends nothing. Used by `ring_attention.py`, `ulysses.py` and
`ddnb/expert_parallel/moe.py`; taught in `notebooks/13_sequence_context_expert.ipynb`.
"""
from __future__ import annotations

import numpy as np
import torch

from ddnb.collectives.ops import header_device, share_rows
from ddnb.collectives.p2p import group_rank, group_size
from ddnb.trace import Tracer

TEXT_BYTES = 512   # a rank's problems travel as up to 512 bytes of UTF-8
DTYPE_CODES = {torch.float16: 1, torch.bfloat16: 2, torch.float32: 3, torch.float64: 4}   # others: 9


def dtype_code(dtype) -> int:
    """A dtype as an integer for the header."""
    return DTYPE_CODES.get(dtype, 9)


def check_qkv(check, q, k, v) -> bool:
    """Add the rules every attention shard obeys to `check` (a ddnb._checks.Checks): q, k,
    v 4-D (batch, heads, seq/N, head_dim), one shape, one floating dtype. True if they hold."""
    shapes = [check.rule(isinstance(t, torch.Tensor) and t.dim() == 4, f"{name} must be a 4-D tensor (batch, "
                         f"heads, seq/N, head_dim), got {tuple(t.shape) if isinstance(t, torch.Tensor) else t!r}")
              for name, t in (("q", q), ("k", k), ("v", v))]
    if not all(shapes):
        return False
    return check.rule(q.shape == k.shape == v.shape, f"q, k and v must have one shape, got {tuple(q.shape)}, "
                      f"{tuple(k.shape)}, {tuple(v.shape)}") & check.rule(
        q.dtype == k.dtype == v.dtype and q.dtype.is_floating_point,
        f"q, k and v must have one floating dtype, got {q.dtype}, {k.dtype}, {v.dtype}")


def _ranks_by(values) -> dict:
    out: dict = {}
    for r, v in enumerate(values):
        out.setdefault(v, []).append(r)
    return out


def agree(what: str, found: list[str], fields: dict[str, int], group=None, tracer: Tracer | None = None) -> None:
    """Raise one ValueError on every rank of `group` if any rank found problems or the
    ranks' `fields` differ; return silently (on every rank) otherwise. `found` is raised
    at once, without a message, when the group has one rank. The headers live on
    `header_device(group)`, the same on every rank whatever its arguments."""
    rank, n = group_rank(group), group_size(group)
    if n == 1:
        if found:
            raise ValueError(f"{what}: " + "; ".join(found))
        return
    text = "; ".join(found).encode()[:TEXT_BYTES].ljust(TEXT_BYTES, b"\0")
    values = [int(v) if not found else -1 for v in fields.values()]
    header = torch.tensor(values + np.frombuffer(text, dtype=np.int64).tolist(), dtype=torch.int64)
    table = share_rows(header.to(header_device(group)), group, tracer)
    k = len(fields)
    texts = [np.array(row[k:], dtype=np.int64).tobytes().rstrip(b"\0").decode(errors="ignore") for row in table]
    if any(texts):
        listing = " ".join(f"Ranks {ranks}: {t}." for t, ranks in _ranks_by(texts).items() if t)
        raise ValueError(f"{what} on rank {rank}: bad arguments. {listing} Nothing was sent.")
    differ = [f"{name}: " + "; ".join(f"ranks {ranks}: {v}" for v, ranks in _ranks_by(col).items())
              for name, col in zip(fields, zip(*[row[:k] for row in table])) if len(set(col)) > 1]
    if differ:
        raise ValueError(f"{what} on rank {rank}: the ranks' calls do not fit together ({'; '.join(differ)}). "
                         f"Every rank must pass shards of the same shape, dtype and options. Nothing was sent.")
