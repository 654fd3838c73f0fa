"""What every all-reduce shares: the reduction ops, input validation, and the cross-rank
check that turns "the ranks passed different tensors" into an error instead of a hang.

An all-reduce combines one tensor from each of the N ranks element by element with an
associative, commutative op ⊕ and leaves the result on every rank:

    x_r  <-  x_0 ⊕ x_1 ⊕ ... ⊕ x_{N-1}        for every rank r        (x_r: (numel,))

The algorithms (`naive.py`, `tree.py`, `ring.py`, `halving_doubling.py`) differ only in
which messages carry the partial results; each one calls, in order,

    op = prepare(tensor, op, group, tracer, check, what="ring_allreduce")
    with flat_view(tensor, group) as x:    # (numel,) contiguous, written back on exit
        ... messages, and combine(acc, incoming, op) on what arrives ...
        finish(x, op, world_size)          # "avg": divide the sum by N

`prepare` rejects a bad op before any message is sent when `check=False`; with
`check=True` the rank first takes part in the check (its header says "unsupported op"),
so that every rank raises, not only this one. With `check=True` it then swaps a
small header (numel, dtype, shape, op, algorithm, root, segment size) among the ranks
(gather at rank 0, table sent back: 2 rounds of HEADER_LEN int64s), so a rank whose
tensor differs from the others' makes *every* rank raise a ValueError naming the ranks
and their shapes, where a bare message exchange would block or silently mix up data.
Taught in `notebooks/05_allreduce.ipynb`.
"""
from __future__ import annotations

import contextlib
import zlib

import torch
import torch.distributed as dist

from ddnb.collectives.p2p import group_rank, group_size, irecv, isend, recv, send
from ddnb.trace import Tracer, get_tracer

OPS = ("sum", "avg", "max", "min", "product")
_REDUCE_OPS = {"SUM": "sum", "AVG": "avg", "MAX": "max", "MIN": "min", "PRODUCT": "product"}

# dtypes the algorithms reduce; the header codes cover more, so that a rank passing an
# unsupported dtype is reported by the cross-rank check on every rank, not only on itself.
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16,
          torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
_CODED_DTYPES = DTYPES + (torch.bool, torch.complex64, torch.complex128)

# the collectives of this package, so the check can name what another rank called
CALLS = ("naive_allreduce", "tree_allreduce", "reduce", "broadcast", "ring_allreduce",
         "ring_reduce_scatter", "ring_allgather", "halving_doubling_allreduce")

UNSUPPORTED = "<unsupported>"  # the op of a rank that passed one we cannot resolve
MAX_DIMS = 8  # dims sent in the header; a longer shape is compared through its hash
# header: numel, dtype, ndim, op, algorithm, root, segment_bytes, shape hash, dims[MAX_DIMS] (-1 padded)
HEADER_LEN = 8 + MAX_DIMS


def resolve_op(op) -> str:
    """The op's name in OPS, from a name ("sum", case-insensitive) or a
    torch.distributed.ReduceOp (SUM, AVG, MAX, MIN, PRODUCT)."""
    if isinstance(op, str) and op.lower() in OPS:
        return op.lower()
    if isinstance(op, (dist.ReduceOp, dist.ReduceOp.RedOpType)):
        for name, ours in _REDUCE_OPS.items():
            if op == getattr(dist.ReduceOp, name, None):
                return ours
    raise ValueError(f"op={op!r} is not supported; use one of {list(OPS)} "
                     f"or torch.distributed.ReduceOp.{{{', '.join(_REDUCE_OPS)}}}")


def combine(acc: torch.Tensor, incoming: torch.Tensor, op: str) -> torch.Tensor:
    """acc <- acc ⊕ incoming, in place, in acc's dtype (as gloo does, also for fp16/bf16)."""
    if op in ("sum", "avg"):
        return acc.add_(incoming)
    if op == "product":
        return acc.mul_(incoming)
    if op == "max":
        return torch.maximum(acc, incoming, out=acc)
    if op == "min":
        return torch.minimum(acc, incoming, out=acc)
    raise ValueError(f"op={op!r} is not one of {list(OPS)}")


def finish(x: torch.Tensor, op: str, world_size: int, tracer: Tracer | None = None) -> torch.Tensor:
    """The last step of "avg": the sum divided by the number of ranks (as torch's gloo
    backend does: sum in the tensor's dtype, then one division)."""
    if op == "avg" and x.numel():
        with get_tracer(tracer).span("compute", "average", nbytes=x.numel() * x.element_size()):
            x.div_(world_size)
    return x


def wire_device(tensor: torch.Tensor, group=None) -> torch.device:
    """Where the messages' buffers must live: the tensor's own device, except that gloo's
    point-to-point messages read host memory only (ProcessGroupGloo::send hands the
    tensor's data pointer to TCP), so a CUDA tensor on a gloo group travels via the host."""
    if tensor.device.type != "cpu" and dist.get_backend(group) == "gloo":
        return torch.device("cpu")
    return tensor.device


@contextlib.contextmanager
def flat_view(tensor: torch.Tensor, group=None):
    """Yield the tensor's elements as one contiguous (numel,) tensor on the wire device
    (`wire_device`): a view when the tensor is contiguous and already there, else a copy
    that is written back into the tensor on exit. Runs under no_grad, like
    torch.distributed's in-place collectives."""
    with torch.no_grad():
        device = wire_device(tensor, group)
        if tensor.is_contiguous() and tensor.device == device:
            yield tensor.view(-1)
        else:
            flat = tensor.reshape(-1).to(device, copy=True)
            yield flat
            tensor.copy_(flat.view(tensor.shape))


def prepare(tensor, op, group=None, tracer: Tracer | None = None, check: bool = True,
            what: str = "allreduce", root: int | None = None, segment_bytes: int | None = None) -> str | None:
    """Validate one rank's call (raise before any message), check with the other ranks
    that they made the same call on the same kind of tensor (if `check`), and return
    the op's name (None when op is None, as for broadcast). `root` and `segment_bytes`
    are the call's other arguments that every rank must agree on, where it has them."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what}: expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.layout != torch.strided:
        raise ValueError(f"{what}: only dense (strided) tensors are supported, got layout {tensor.layout}")
    n = group_size(group)
    try:
        name, bad_op = (None if op is None else resolve_op(op)), None
    except ValueError as e:  # still take part in the check, so the other ranks raise too
        if not (check and n > 1):
            raise
        name, bad_op = UNSUPPORTED, e
    if root is not None and not 0 <= root < n:
        raise ValueError(f"{what}: root rank {root} is not in the group of world_size {n} (0..{n - 1})")
    if check and n > 1:
        check_same_across_ranks(tensor, name, what, root, group, tracer, segment_bytes)
    if bad_op is not None:
        raise bad_op
    if tensor.dtype not in DTYPES:
        raise TypeError(f"{what}: dtype {tensor.dtype} is not supported; use one of "
                        f"{[str(d).replace('torch.', '') for d in DTYPES]}")
    if name == "avg" and not tensor.is_floating_point():
        raise ValueError(f"{what}: op='avg' needs a floating-point tensor, got {tensor.dtype} "
                         f"(torch.distributed's gloo backend rejects it too); use op='sum' and "
                         f"divide by world_size={n} the way you want")
    return name


# ----------------------------------------------------------------------------- the check


def _header(tensor: torch.Tensor, op: str | None, what: str, root: int | None,
            segment_bytes: int | None) -> torch.Tensor:
    dtype_code = _CODED_DTYPES.index(tensor.dtype) if tensor.dtype in _CODED_DTYPES else len(_CODED_DTYPES)
    shape = tuple(tensor.shape)
    dims = list(shape[:MAX_DIMS]) + [-1] * (MAX_DIMS - min(len(shape), MAX_DIMS))
    op_code = -1 if op is None else (OPS.index(op) if op in OPS else len(OPS))
    values = [tensor.numel(), dtype_code, len(shape), op_code,
              zlib.crc32(what.encode()), -1 if root is None else root,
              -1 if segment_bytes is None else segment_bytes, zlib.crc32(repr(shape).encode())] + dims
    return torch.tensor(values, dtype=torch.int64)  # (HEADER_LEN,)


def _describe(row: list[int], what_by_crc: dict) -> str:
    numel, dtype_code, ndim, op_code, what_crc, root, segment_bytes, _, *dims = row
    dtype = str(_CODED_DTYPES[dtype_code]).replace("torch.", "") if dtype_code < len(_CODED_DTYPES) else "other"
    shape = tuple(dims[:min(ndim, MAX_DIMS)])
    shape_s = str(shape) if ndim <= MAX_DIMS else f"{str(shape)[:-1]}, ...) ndim={ndim} numel={numel}"
    args = [f"shape={shape_s}", f"dtype={dtype}"]
    if op_code >= 0:
        args.append(f"op={OPS[op_code]!r}" if op_code < len(OPS) else f"op={UNSUPPORTED}")
    if root >= 0:
        args.append(f"root={root}")
    if segment_bytes >= 0:
        args.append(f"segment_bytes={segment_bytes}")
    return f"{what_by_crc.get(what_crc, 'another collective')}({', '.join(args)})"


def check_same_across_ranks(tensor: torch.Tensor, op: str | None, what: str, root: int | None = None,
                            group=None, tracer: Tracer | None = None, segment_bytes: int | None = None) -> None:
    """Gather every rank's header at rank 0, send the table back to all, and raise the
    same ValueError on every rank if any two rows differ. 2 message rounds of
    HEADER_LEN·8 and N·HEADER_LEN·8 bytes, traced as "check"."""
    rank, n = group_rank(group), group_size(group)
    device = wire_device(tensor, group)
    header = _header(tensor, op, what, root, segment_bytes).to(device)       # (H,)
    table = torch.empty(n, HEADER_LEN, dtype=torch.int64, device=device)     # (N, H)
    if rank == 0:
        table[0] = header
        for p in [irecv(table[src], src, group, tracer, name="check") for src in range(1, n)]:
            p.wait()
        for p in [isend(table, dst, group, tracer, name="check") for dst in range(1, n)]:
            p.wait()
    else:
        send(header, 0, group, tracer, name="check")
        recv(table, 0, group, tracer, name="check")
    rows = table.tolist()
    if all(row == rows[0] for row in rows):
        return
    calls: dict[str, list[int]] = {}
    for r, row in enumerate(rows):
        calls.setdefault(_describe(row, {zlib.crc32(w.encode()): w for w in CALLS + (what,)}), []).append(r)
    listing = "; ".join(f"ranks {ranks}: {call}" for call, ranks in calls.items())
    raise ValueError(f"{what} on rank {rank}: the ranks made different calls: {listing}. Every rank of "
                     f"the group must pass a tensor of the same shape and dtype, with the same op and root.")
