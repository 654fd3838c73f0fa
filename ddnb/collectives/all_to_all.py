"""All-to-all from point-to-point messages (`p2p.exchange`): every rank sends a different
piece of its input to every rank, the exchange an expert-parallel Mixture-of-Experts
layer makes twice per layer (tokens to their experts, results back). The call shape of
torch.distributed.all_to_all_single (MPI_Alltoall, and MPI_Alltoallv with split sizes):

    input  (rows_in, *row):   cut along dim 0 into N chunks; chunk j goes to rank j
    output (rows_out, *row):  chunk i is the one rank i sent here

Equal splits: every chunk has rows/N rows. Uneven: `input_split_sizes` and
`output_split_sizes`, N row counts each, as torch takes them; rank i's
input_split_sizes[j] must equal rank j's output_split_sizes[i] (an MoE router's token
counts, exchanged first); a 0 is a pair with nothing to send. Two algorithms
(Thakur, Rabenseifner & Gropp 2005, "Optimization of collective communication
operations in MPICH", IJHPCA 19(1), Sec. 3, all-to-all):

    all_to_all        pairwise exchange, N-1 rounds: in round k = 1..N-1 rank r sends
                      chunk (r+k) to rank r+k and receives chunk (r-k) from rank r-k
                      (mod N). Every rank sends and receives one chunk per round, each
                      chunk once: what MPICH runs for long messages.
    bruck_all_to_all  (Bruck, Ho, Kipnis, Upfal & Weathersby 1997, "Efficient algorithms
                      for all-to-all communications in multiport message-passing systems",
                      IEEE TPDS 8(11): their "index" operation with one port), equal
                      splits only:
        rotate:   tmp[i] = my chunk (r+i) mod N, the one for the rank i ahead
        round k = 0..ceil(lg N)-1: send every tmp[i] with bit k of i set to rank r+2^k,
                  packed into one message; receive the same positions from rank r-2^k.
                  A chunk travels the binary digits of its distance, one per round, so
                  at the end tmp[i] on rank r is the chunk rank r-i sent to r.
        unrotate: output chunk j = tmp[(r-j) mod N].

With the alpha-beta model (n: the bytes of one rank's input, n/N per chunk;
`ddnb.cost.alltoall_time`):

    T_pairwise = (N-1) α + (N-1)/N · n β
    T_bruck    = ceil(lg N) α + B β,   B = n/N · Σ_k #{i < N : bit k of i is set}

B = lg N · n/2 when N is a power of two (Thakur et al.'s ceil(lg N) n/2 β), less
otherwise: Bruck sends each byte lg N / 2 times on average instead of once, in lg N
messages instead of N-1, which pays off when chunks are small and α dominates.

Both check their arguments first (`check=True`, as the all-reduces do, `ops.prepare`):
each rank's problems (tensors, dtypes, row shapes, split sizes) and how the ranks' calls
fit together (the same algorithm, dtype and row shape; matching split sizes) travel in
one header per rank (`ops.share_rows`), so that every rank raises the same ValueError,
listing every problem, before any data moves. check=False raises this rank's own
problems at once, sends nothing to check, and hangs or garbles on mismatched ranks.
Taught in `notebooks/03_collectives.ipynb`.
"""
from __future__ import annotations

import math
import numbers
import zlib

import numpy as np
import torch

from ddnb._checks import Checks
from ddnb.collectives.ops import MAX_DIMS, _check_device, _check_group, _input_kind, flat_view, share_rows
from ddnb.collectives.p2p import exchange, group_rank, group_size, nbytes
from ddnb.trace import Tracer, get_tracer

CALLS = ("all_to_all", "bruck_all_to_all")
TEXT_BYTES = 1024   # a rank's problems travel in its header as up to 1 KiB of UTF-8
_DTYPES = tuple(sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str))
_FIXED = 4 + MAX_DIMS   # header: call, dtype, row ndim, row shape hash, row dims; then splits and text


# ----------------------------------------------------------------------------- arguments
def _splits(check: Checks, name: str, sizes, tname: str, rows: int | None, n: int) -> list[int] | None:
    """The N row counts of one tensor's chunks (None: unknown, a problem is recorded)."""
    if sizes is None:
        if rows is not None and check.rule(rows % n == 0, f"{tname}.shape[0]={rows} is not divisible by "
                                           f"world_size={n}; pass {name} (N row counts) to split it unevenly"):
            return [rows // n] * n
        return None
    if not isinstance(sizes, (list, tuple)):
        check.rule(False, f"{name}={sizes!r}: need a list of world_size={n} row counts (integers >= 0)")
        return None
    if not check.rule(len(sizes) == n, f"{name} has {len(sizes)} entr{'y' if len(sizes) == 1 else 'ies'}, need "
                                       f"world_size={n} (one row count per rank)"):
        return None
    if not check.rule(all(isinstance(s, numbers.Integral) and not isinstance(s, bool) and s >= 0 for s in sizes),
                      f"{name}={list(sizes)!r}: row counts must be integers >= 0"):
        return None
    sizes = [int(s) for s in sizes]
    if rows is not None and check.rule(sum(sizes) == rows, f"{name}={sizes} sums to {sum(sizes)}, but {tname} "
                                                           f"has {rows} rows (shape[0])"):
        return sizes
    return None


def _kind_problem(name: str, t, kind: int) -> str:
    """What is wrong with `t`, of `ops._input_kind` `kind` ("" for 0, a tensor it can send)."""
    return {0: lambda: "",
            1: lambda: f"{name} must be a torch.Tensor, got {type(t).__name__}",
            2: lambda: f"{name} must be a dense (strided) tensor, got layout {t.layout}",
            3: lambda: f"{name} is on the meta device: it has no data",
            4: lambda: f"{name}'s elements overlap in memory (shape {tuple(t.shape)}, stride {t.stride()}, e.g. "
                       f"from expand()), so it cannot hold one value per element; pass a clone()"}[kind]()


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    """[first, last) byte addresses the (non-negatively strided) tensor's elements span."""
    span = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + (span + 1) * t.element_size()


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors' memory ranges intersect (conservative for interleaved views)."""
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False
    (a0, a1), (b0, b1) = _byte_range(a), _byte_range(b)
    return a0 < b1 and b0 < a1


def problems(output, input, output_split_sizes, input_split_sizes, world_size: int):
    """(every problem of one rank's arguments, as sentences ([] when valid); the output's
    and the input's N chunk sizes in rows, None where a problem leaves them unknown)."""
    check = Checks()
    tensors = True
    for name, t in (("output", output), ("input", input)):
        kind = _input_kind(t)
        kind = 0 if kind == 4 and name == "input" else kind      # an expanded input reads fine
        ok = check.rule(kind == 0, _kind_problem(name, t, kind))
        tensors &= ok and check.rule(t.dim() >= 1, f"{name} is 0-dim: all-to-all splits dim 0")
    if tensors:
        check.rule(output.dtype == input.dtype, f"output.dtype={output.dtype} but input.dtype={input.dtype}: "
                                                f"all-to-all moves rows, it does not convert them")
        check.rule(output.shape[1:] == input.shape[1:], f"output.shape={tuple(output.shape)} and input.shape="
                   f"{tuple(input.shape)} differ beyond dim 0: every row (shape[1:]) must be the same")
        check.rule(output.device == input.device, f"output is on {output.device}, input on {input.device}")
        check.rule(not _overlap(output, input), "output and input overlap in memory: all-to-all cannot work "
                                                 "in place; pass a separate output")
    out = _splits(check, "output_split_sizes", output_split_sizes, "output", output.shape[0] if tensors else None,
                  world_size)
    inp = _splits(check, "input_split_sizes", input_split_sizes, "input", input.shape[0] if tensors else None,
                  world_size)
    return check.problems, out, inp


# ----------------------------------------------------------------------------- the check
def _header(what: str, found: list[str], input, out_splits, in_splits, n: int) -> torch.Tensor:
    """One rank's call as int64s: call, dtype, row ndim, row shape hash, row dims
    (MAX_DIMS, -1 padded), input split sizes (N), output split sizes (N), problems
    (TEXT_BYTES of UTF-8). Only the call and the text mean anything when there are problems."""
    text = "; ".join(found).encode()[:TEXT_BYTES].ljust(TEXT_BYTES, b"\0")
    if found:
        fixed, splits = [CALLS.index(what)] + [-1] * (_FIXED - 1), [-1] * (2 * n)
    else:
        row = tuple(input.shape[1:])
        dims = list(row[:MAX_DIMS]) + [-1] * (MAX_DIMS - min(len(row), MAX_DIMS))
        fixed = [CALLS.index(what), _DTYPES.index(input.dtype), len(row), zlib.crc32(repr(row).encode())] + dims
        splits = in_splits + out_splits
    return torch.tensor(fixed + splits + np.frombuffer(text, dtype=np.int64).tolist(), dtype=torch.int64)


def _ranks_by(values) -> dict:
    """{value: [the ranks that have it]}, in rank order."""
    out: dict = {}
    for r, v in enumerate(values):
        out.setdefault(v, []).append(r)
    return out


def _listing(values) -> str:
    return "; ".join(f"ranks {ranks}: {v}" for v, ranks in _ranks_by(values).items())


def _rows_of(row: list[int]) -> str:
    dtype, ndim, dims = _DTYPES[row[1]], row[2], tuple(row[4:4 + min(row[2], MAX_DIMS)])
    shape = str(dims) if ndim <= MAX_DIMS else f"{str(dims)[:-1]}, ...) ndim={ndim}"
    return f"{str(dtype).replace('torch.', '')} rows of shape {shape}"


def _agree(table: list[list[int]], what: str, rank: int, n: int) -> None:
    """Raise the same ValueError on every rank if any rank's arguments are bad, or if the
    calls do not fit together; `table` holds every rank's `_header`."""
    texts = [np.array(row[-TEXT_BYTES // 8:], dtype=np.int64).tobytes().rstrip(b"\0").decode(errors="ignore")
             for row in table]
    if any(texts):
        listing = " ".join(f"Ranks {ranks}: {t}." for t, ranks in _ranks_by(texts).items() if t)
        raise ValueError(f"{what} on rank {rank}: bad arguments. {listing} Nothing was sent.")
    parts = []
    if len(set(row[0] for row in table)) > 1:
        parts.append("the ranks called different collectives: " + _listing(CALLS[row[0]] for row in table))
    if len(set(tuple(row[1:_FIXED]) for row in table)) > 1:
        parts.append("the ranks' rows differ: " + _listing(_rows_of(row) for row in table))
    sends = [row[_FIXED:_FIXED + n] for row in table]         # sends[i][j]: rows rank i sends to rank j
    expects = [row[_FIXED + n:_FIXED + 2 * n] for row in table]  # expects[j][i]: rows rank j expects from i
    wrong = [f"rank {i} sends {sends[i][j]} rows to rank {j}, which expects {expects[j][i]}"
             for i in range(n) for j in range(n) if sends[i][j] != expects[j][i]]
    if wrong:
        more = f" (and {len(wrong) - 6} more)" if len(wrong) > 6 else ""
        parts.append("the split sizes do not match: " + ", ".join(wrong[:6]) + more)
    if parts:
        raise ValueError(f"{what} on rank {rank}: " + "; ".join(parts) + ". Every rank must call the same "
                         "all-to-all with one dtype and row shape, and rank i's input_split_sizes[j] must equal "
                         "rank j's output_split_sizes[i]. Nothing was sent.")


def _prepare(what, output, input, output_split_sizes, input_split_sizes, group, tracer, check):
    """(rank, N, the output's and the input's chunk sizes in rows) after the checks; see the
    module's docstring for what raises where."""
    _check_group(group, what)
    rank, n = group_rank(group), group_size(group)
    found, out_splits, in_splits = problems(output, input, output_split_sizes, input_split_sizes, n)
    if not check:
        if found:
            raise ValueError(f"{what} on rank {rank}: " + "; ".join(found))
        return rank, n, out_splits, in_splits
    header = _header(what, found, input, out_splits, in_splits, n)
    table = share_rows(header.to(_check_device(input, group)), group, tracer) if n > 1 else [header.tolist()]
    _agree(table, what, rank, n)
    return rank, n, out_splits, in_splits


# ----------------------------------------------------------------------------- algorithms
def _offsets(splits: list[int], row: int) -> list[int]:
    """Element offsets of the chunks: chunk j is elements at[j]..at[j+1]-1."""
    at = [0]
    for s in splits:
        at.append(at[-1] + s * row)
    return at


def all_to_all(output: torch.Tensor, input: torch.Tensor, output_split_sizes=None, input_split_sizes=None,
               group=None, tracer: Tracer | None = None, check: bool = True) -> torch.Tensor:
    """torch.distributed.all_to_all_single(output, input, output_split_sizes,
    input_split_sizes, group), by pairwise exchange: input chunk j (dim 0) goes to rank j,
    output chunk i is written with what rank i sent; returns `output`. Split sizes: None
    (equal chunks, shape[0]/N rows) or N row counts, zeros allowed. Every message is
    recorded in `tracer` ("all_to_all"). check: as the all-reduces' (`ops.prepare`):
    first agree with the other ranks that the call is valid, so that a bad argument on
    any rank raises the same ValueError on every rank; turn off only in benchmarks.

    `python -m ddnb.bench alltoall --workers 4 --sizes 4KB..16MB` times it against
    torch's (gloo's) all_to_all_single."""
    rank, n, out_splits, in_splits = _prepare("all_to_all", output, input, output_split_sizes,
                                              input_split_sizes, group, tracer, check)
    row = math.prod(input.shape[1:])                                  # elements per row
    with flat_view(output, group) as y:                               # (rows_out·row,)
        x = input.detach().reshape(-1).to(y.device).contiguous()     # (rows_in·row,)
        send_at, recv_at = _offsets(in_splits, row), _offsets(out_splits, row)
        with get_tracer(tracer).span("compute", "copy", nbytes=nbytes(x[send_at[rank]:send_at[rank + 1]])):
            y[recv_at[rank]:recv_at[rank + 1]].copy_(x[send_at[rank]:send_at[rank + 1]])
        for k in range(1, n):
            dst, src = (rank + k) % n, (rank - k) % n
            give, take = x[send_at[dst]:send_at[dst + 1]], y[recv_at[src]:recv_at[src + 1]]
            # an empty chunk is not sent; its receiver knows its size too (the check) and skips it
            exchange(give if give.numel() else None, dst, take if take.numel() else None, src,
                     group, tracer, name="all_to_all")
    return output


def bruck_all_to_all(output: torch.Tensor, input: torch.Tensor, group=None, tracer: Tracer | None = None,
                     check: bool = True) -> torch.Tensor:
    """all_to_all with equal splits by Bruck's algorithm: ceil(lg N) rounds, each one
    message of the chunks whose distance has that bit set (see the module's docstring);
    returns `output`. Messages are recorded as "bruck", the local rearrangements as
    "compute" events; check as `all_to_all`."""
    rank, n, out_splits, in_splits = _prepare("bruck_all_to_all", output, input, None, None, group, tracer, check)
    tr = get_tracer(tracer)
    b = in_splits[0] * math.prod(input.shape[1:])                     # elements per chunk
    with flat_view(output, group) as y:                               # (N·b,)
        x = input.detach().reshape(-1).to(y.device).contiguous()     # (N·b,)
        if b == 0:
            return output
        with tr.span("compute", "rotate", nbytes=nbytes(x)):
            tmp = torch.roll(x.view(n, b), -rank, 0)                  # (N, b): tmp[i] is for rank r+i
        k = 1
        while k < n:
            idx = torch.tensor([i for i in range(n) if i & k], device=x.device)   # (m,)
            with tr.span("compute", "pack", nbytes=len(idx) * b * x.element_size()):
                give = tmp.index_select(0, idx)                         # (m, b)
            take = torch.empty_like(give)                               # (m, b)
            exchange(give, (rank + k) % n, take, (rank - k) % n, group, tracer, name="bruck")
            with tr.span("compute", "unpack", nbytes=nbytes(take)):
                tmp.index_copy_(0, idx, take)
            k *= 2
        order = torch.tensor([(rank - j) % n for j in range(n)], device=x.device)  # tmp[(r-j) mod N] is from j
        with tr.span("compute", "unrotate", nbytes=nbytes(x)):
            torch.index_select(tmp, 0, order, out=y.view(n, b))
    return output


ALL_TO_ALLS = {"pairwise": all_to_all, "bruck": bruck_all_to_all}   # fn(output, input, group=, tracer=, check=)
