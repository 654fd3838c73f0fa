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

`prepare` rejects a bad group at once (the check runs on the group, so there is nothing
to check with). Any other bad value (not a tensor, a sparse, meta or self-overlapping
tensor, an unknown op, a root that is not a rank of the group, an unsupported dtype)
raises before any message when `check=False`; with `check=True` the rank first takes
part in the check, its header marking what is wrong, so that every rank raises, not
only this one. The check swaps a small header (numel, dtype, shape, op, algorithm,
root, segment size, kind of input) among the ranks (gather at rank 0, table sent back:
2 rounds of HEADER_LEN int64s), so a rank whose tensor differs from the others' makes
*every* rank raise a ValueError naming the ranks and their shapes, where a bare message
exchange would block or silently mix up data.
Taught in `notebooks/05_allreduce.ipynb`.
"""
from __future__ import annotations

import contextlib
import numbers
import zlib

import torch
import torch.distributed as dist

from ddnb.collectives.devices import header_device, wire_device  # noqa: F401  (the collectives' own)
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

OPLESS_CALLS = ("broadcast", "ring_allgather")   # the calls without an op (prepare gets op=None)
ROOT_CALLS = ("reduce", "broadcast")             # the calls with a root rank (dst / src)

UNSUPPORTED = "<unsupported>"  # the op of a rank that passed one we cannot resolve
NO_ROOT, BAD_ROOT = -1, -2     # header codes: a call without a root; a root that is not a rank
NO_SEGMENT, BAD_PIPELINE = -1, -2  # header codes: a call without segments; a bad segment_bytes or depth
# what a rank passed as its tensor: only the first kind can be sent (header code: the index)
INPUTS = ("tensor", "<not a tensor>", "<not a strided tensor>", "<meta tensor, no data>",
          "<tensor whose elements overlap in memory>")
MAX_DIMS = 8  # dims sent in the header; a longer shape is compared through its hash
MAX_SEGMENT = 1 << 62  # larger segment sizes all mean "a whole chunk per message": sent as this
# header: numel, dtype, ndim, op, algorithm, root, segment_bytes, shape hash, input, dims[MAX_DIMS] (-1 padded)
HEADER_LEN = 9 + MAX_DIMS


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


def _input_kind(tensor) -> int:
    """Index in INPUTS of what was passed as the tensor: 0 for one the collectives can send."""
    if not isinstance(tensor, torch.Tensor):
        return 1
    if tensor.layout != torch.strided:
        return 2
    if tensor.device.type == "meta":
        return 3
    if tensor.numel() > 1 and any(stride == 0 and size > 1 for size, stride in zip(tensor.shape, tensor.stride())):
        return 4   # e.g. x.expand(...): writing the result back would need one value per element
    return 0


def _check_group(group, what: str) -> None:
    """A group this rank can communicate on (None: the default group). Raised at once, on
    this rank only: the cross-rank check itself runs on the group."""
    if group is None or isinstance(group, dist.ProcessGroup):
        return
    if isinstance(group, int) and not isinstance(group, bool) and group == dist.GroupMember.NON_GROUP_MEMBER:
        raise ValueError(f"{what}: global rank {dist.get_rank()} is not a member of this group (dist.new_group "
                         f"returned GroupMember.NON_GROUP_MEMBER here); call a group's collectives on its "
                         f"members only")
    raise TypeError(f"{what}: group must be a torch.distributed ProcessGroup (from dist.new_group) or None "
                    f"for the default group, got {group!r} ({type(group).__name__})")


def _valid_root(root, n: int) -> bool:
    return not isinstance(root, bool) and isinstance(root, numbers.Integral) and 0 <= root < n


def prepare(tensor, op, group=None, tracer: Tracer | None = None, check: bool = True,
            what: str = "allreduce", root: int | None = None, segment_bytes: int | None = None,
            depth: int | None = None) -> str | None:
    """Validate one rank's call, check with the other ranks that they made the same call
    on the same kind of tensor (if `check`), and return the op's name (None for the
    OPLESS_CALLS, which pass op=None). `root` (for the ROOT_CALLS) and `segment_bytes` are
    the call's other arguments that every rank must agree on, where it has them; `depth`
    (receives in flight, the ring's) need not agree but must be valid. A bad value raises
    on this rank after it has taken part in the check (before, if not `check`), so that
    the other ranks raise too instead of waiting for it."""
    _check_group(group, what)
    n = group_size(group)
    problems: list[Exception] = []    # raised after the check, the first one
    kind = _input_kind(tensor)
    if kind == 1:
        problems.append(TypeError(f"{what}: expected a torch.Tensor, got {type(tensor).__name__}"))
    elif kind == 2:
        problems.append(ValueError(f"{what}: only dense (strided) tensors are supported, got layout {tensor.layout}"))
    elif kind == 3:
        problems.append(ValueError(f"{what}: a tensor on the meta device has no data to send"))
    elif kind == 4:
        problems.append(ValueError(f"{what}: the tensor's elements overlap in memory (shape {tuple(tensor.shape)}, "
                                   f"stride {tensor.stride()}, e.g. from expand()), so it cannot hold one result "
                                   f"per element; pass a clone()"))
    name = None
    if op is not None or what not in OPLESS_CALLS:
        try:
            name = resolve_op(op)
        except ValueError as e:
            name = UNSUPPORTED
            problems.append(ValueError(f"{what}: {e}"))
    if what in ROOT_CALLS and not _valid_root(root, n):
        problems.append((ValueError if isinstance(root, numbers.Integral) and not isinstance(root, bool)
                         else TypeError)(f"{what}: root rank {root!r} is not in the group of world_size {n} "
                                         f"(an int in 0..{n - 1})"))
    if kind == 0 and tensor.dtype not in DTYPES:
        problems.append(TypeError(f"{what}: dtype {tensor.dtype} is not supported; use one of "
                                  f"{[str(d).replace('torch.', '') for d in DTYPES]}"))
    elif kind == 0 and name == "avg" and not tensor.is_floating_point():
        problems.append(ValueError(f"{what}: op='avg' needs a floating-point tensor, got {tensor.dtype} "
                                   f"(torch.distributed's gloo backend rejects it too); use op='sum' and "
                                   f"divide by world_size={n} the way you want"))
    pipeline = [(k, v) for k, v in (("segment_bytes", segment_bytes), ("depth", depth)) if v is not None]
    bad = [f"{k}={v!r}" for k, v in pipeline if not (isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= 1)]
    if bad:
        problems.append(ValueError(f"{what}: need integers segment_bytes >= 1 and depth >= 1, got {', '.join(bad)}"))
        segment_bytes = BAD_PIPELINE
    if check and n > 1:
        check_same_across_ranks(tensor, name, what, root, group, tracer, segment_bytes)
    if problems:
        raise problems[0]
    return name


# ----------------------------------------------------------------------------- the check


def _header(tensor, op: str | None, what: str, root: int, segment_bytes: int | None) -> torch.Tensor:
    """One rank's call as HEADER_LEN int64s; `tensor` may be anything (INPUTS), `root` is
    already a code (a rank, NO_ROOT or BAD_ROOT)."""
    kind = _input_kind(tensor)
    shape = tuple(tensor.shape) if kind != 1 else ()
    dtype = tensor.dtype if kind != 1 else None
    dtype_code = _CODED_DTYPES.index(dtype) if dtype in _CODED_DTYPES else len(_CODED_DTYPES)
    dims = list(shape[:MAX_DIMS]) + [-1] * (MAX_DIMS - min(len(shape), MAX_DIMS))
    op_code = -1 if op is None else (OPS.index(op) if op in OPS else len(OPS))
    values = [tensor.numel() if kind != 1 else 0, dtype_code, len(shape), op_code,
              zlib.crc32(what.encode()), root,
              NO_SEGMENT if segment_bytes is None else min(int(segment_bytes), MAX_SEGMENT),
              zlib.crc32(repr(shape).encode()),
              kind] + dims
    return torch.tensor(values, dtype=torch.int64)  # (HEADER_LEN,)


def _describe(row: list[int], what_by_crc: dict) -> str:
    numel, dtype_code, ndim, op_code, what_crc, root, segment_bytes, _, kind, *dims = row
    dtype = str(_CODED_DTYPES[dtype_code]).replace("torch.", "") if dtype_code < len(_CODED_DTYPES) else "other"
    shape = tuple(dims[:min(ndim, MAX_DIMS)])
    shape_s = str(shape) if ndim <= MAX_DIMS else f"{str(shape)[:-1]}, ...) ndim={ndim} numel={numel}"
    args = [f"tensor={INPUTS[kind]}"] if kind == 1 else [f"shape={shape_s}", f"dtype={dtype}"]
    if kind > 1:
        args.append(f"tensor={INPUTS[kind]}")
    if op_code >= 0:
        args.append(f"op={OPS[op_code]!r}" if op_code < len(OPS) else f"op={UNSUPPORTED}")
    if root >= 0:
        args.append(f"root={root}")
    elif root == BAD_ROOT:
        args.append("root=<not a rank of the group>")
    if segment_bytes >= 0:
        args.append(f"segment_bytes={segment_bytes}")
    elif segment_bytes == BAD_PIPELINE:
        args.append("segment_bytes or depth=<not an integer >= 1>")
    return f"{what_by_crc.get(what_crc, 'another collective')}({', '.join(args)})"


def _check_device(tensor, group) -> torch.device:
    """Where the check's headers travel: `header_device(group)`, the same on every rank
    whatever it was passed (a tensor, or something that is not one)."""
    return header_device(group)


def share_rows(row: torch.Tensor, group=None, tracer: Tracer | None = None) -> list[list[int]]:
    """Every rank's `row` (int64s, the same length on every rank) as a table on every rank,
    row r from rank r: gathered at rank 0, the table sent back (2 message rounds, traced as
    "check"). What the cross-rank checks of the collectives exchange."""
    rank, n = group_rank(group), group_size(group)
    table = torch.empty(n, row.numel(), dtype=row.dtype, device=row.device)   # (N, H)
    if rank == 0:
        table[0] = row
        for p in [irecv(table[src], src, group, tracer, name="check") for src in range(1, n)]:
            p.wait()
        for p in [isend(table, dst, group, tracer, name="check") for dst in range(1, n)]:
            p.wait()
    else:
        send(row, 0, group, tracer, name="check")
        recv(table, 0, group, tracer, name="check")
    return table.tolist()


def check_same_across_ranks(tensor, op: str | None, what: str, root: int | None = None,
                            group=None, tracer: Tracer | None = None, segment_bytes: int | None = None) -> None:
    """Gather every rank's header at rank 0, send the table back to all, and raise the
    same ValueError on every rank if any two rows differ. 2 message rounds of
    HEADER_LEN·8 and N·HEADER_LEN·8 bytes, traced as "check"."""
    rank, n = group_rank(group), group_size(group)
    device = _check_device(tensor, group)
    if root is None and what not in ROOT_CALLS:
        root_code = NO_ROOT
    else:
        root_code = int(root) if _valid_root(root, n) else BAD_ROOT
    rows = share_rows(_header(tensor, op, what, root_code, segment_bytes).to(device), group, tracer)
    if all(row == rows[0] for row in rows):
        return
    calls: dict[str, list[int]] = {}
    for r, row in enumerate(rows):
        calls.setdefault(_describe(row, {zlib.crc32(w.encode()): w for w in CALLS + (what,)}), []).append(r)
    listing = "; ".join(f"ranks {ranks}: {call}" for call, ranks in calls.items())
    raise ValueError(f"{what} on rank {rank}: the ranks made different calls: {listing}. Every rank of "
                     f"the group must pass a tensor of the same shape and dtype, with the same op and root.")
