"""Ring all-reduce: a reduce-scatter then an all-gather around a ring, chunked and
pipelined (Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce algorithms for clusters
of workstations", JPDC 69(2); the algorithm Baidu and Horovod brought to deep learning).

The flat tensor (numel,) is cut into N chunks, one per rank (`chunk_bounds`). Every step,
every rank sends one chunk to its right neighbour (rank+1) and receives one from its left
(rank-1), all links busy at once:

    reduce-scatter, step s = 0..N-2: send chunk (r-s-1), receive chunk (r-s-2) and ⊕ it
        into mine. A chunk starts at rank c+1 and collects one contribution per hop, so
        after N-1 steps rank r holds chunk r fully reduced.
    all-gather,     step s = 0..N-2: send chunk (r-s), receive chunk (r-s-1) into place.

Each rank sends 2(N-1) chunks of S/N bytes, 2(N-1)/N · S in all, whatever N is: the
lower bound for an all-reduce (Patarasuk & Yuan 2009, Sec. 3), so with the α-β model
(Thakur, Rabenseifner & Gropp 2005, IJHPCA 19(1)):

    T_ring = 2 (N-1) α + 2 (N-1)/N · S β + (N-1)/N · S γ      (γ: time per byte of ⊕)

Chunked and pipelined: each chunk is sent as segments of at most `segment_bytes`. The
chunk a rank receives at step s is the chunk it sends at step s+1, so as soon as one
segment has arrived and been reduced it is forwarded, while the next segments are still
on the wire: the ⊕ of one segment overlaps the transfer of the next, and no rank waits
for a whole chunk before passing it on. During the reduce-scatter `depth` receives are in
flight (gloo's ring keeps two), each into its own preallocated slot of scratch,
(depth, segment); during the all-gather all receives are posted at once, straight into
place. Receives are posted before sends: a message moves only once its receive is posted.
Taught in `notebooks/05_allreduce.ipynb` (drawn step by step by `ddnb.viz.allreduce_steps`).
"""
from __future__ import annotations

import torch

from ddnb.collectives.ops import combine, finish, flat_view, prepare
from ddnb.collectives.p2p import group_rank, group_size, irecv, isend, nbytes
from ddnb.trace import Tracer, get_tracer

SEGMENT_BYTES = 4 << 20  # pipeline segment: best of 1, 2, 4 MiB measured (ring_allreduce)
DEPTH = 2                # reduce-scatter receives in flight


def chunk_bounds(numel: int, world_size: int) -> list[tuple[int, int]]:
    """[(start, stop)] of the N chunks of a flat tensor of `numel` elements: chunk c is
    elements start..stop-1 and belongs to rank c. The first numel % N chunks have one
    element more than the others (the layout of torch.tensor_split); when numel < N the
    last chunks are empty. E.g. numel=10, N=4: [(0, 3), (3, 6), (6, 8), (8, 10)]."""
    if numel < 0 or world_size < 1:
        raise ValueError(f"need numel >= 0 and world_size >= 1, got numel={numel}, world_size={world_size}")
    q, extra = divmod(numel, world_size)
    bounds, start = [], 0
    for c in range(world_size):
        stop = start + q + (1 if c < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def segment_bounds(start: int, stop: int, seg: int) -> list[tuple[int, int]]:
    """[(a, b)]: the pipeline segments of elements start..stop-1, each at most `seg` long,
    none empty, in the order they are sent. E.g. (0, 10), seg=4: [(0, 4), (4, 8), (8, 10)]."""
    return [(a, min(a + seg, stop)) for a in range(start, stop, seg)]


def segment_elements(segment_bytes: int, element_size: int) -> int:
    """Elements in a pipeline segment of at most `segment_bytes` (at least one)."""
    return max(1, segment_bytes // element_size)


def _reduce_scatter(x, op, rank, n, group, tracer, seg, depth) -> tuple[int, int]:
    """Ring reduce-scatter of the flat x (numel,) in place; returns this rank's chunk bounds."""
    bounds = chunk_bounds(x.numel(), n)
    right, left = (rank + 1) % n, (rank - 1) % n
    # Everything this rank receives, in order: segment (a, b) of chunk (r-step-2) at `step`.
    arrivals = [(step, a, b) for step in range(n - 1) for a, b in segment_bounds(*bounds[(rank - step - 2) % n], seg)]
    width = min(seg, bounds[0][1] - bounds[0][0])
    slots = torch.empty(depth, width, dtype=x.dtype, device=x.device)    # (depth, seg) of scratch
    tr = get_tracer(tracer)

    def post(j):   # receive arrival j into slot j % depth, free since arrival j - depth is reduced
        _, a, b = arrivals[j]
        return irecv(slots[j % depth, :b - a], left, group, tracer, name="reduce-scatter")

    # Receives first: a send's data moves only once the receiver has posted its buffer,
    # and posting a send copies into the socket right away, which takes a while.
    pending = [post(j) for j in range(min(depth, len(arrivals)))]
    sends = [isend(x[a:b], right, group, tracer, name="reduce-scatter")
             for a, b in segment_bounds(*bounds[(rank - 1) % n], seg)]             # step 0: my own data
    for j, (step, a, b) in enumerate(arrivals):
        pending[j].wait()
        with tr.span("compute", "reduce", nbytes=nbytes(x[a:b])):
            combine(x[a:b], slots[j % depth, :b - a], op)                   # (seg,) ⊕= (seg,)
        if j + depth < len(arrivals):
            pending.append(post(j + depth))                               # its slot is free again
        if step < n - 2:   # what I just reduced is what I send at step+1: forward it now
            sends.append(isend(x[a:b], right, group, tracer, name="reduce-scatter"))
    for s in sends:
        s.wait()
    return bounds[rank]


def _allgather(x, rank, n, group, tracer, seg) -> None:
    """Ring all-gather of the flat x (numel,) in place: chunk r of rank r goes to every rank."""
    bounds = chunk_bounds(x.numel(), n)
    right, left = (rank + 1) % n, (rank - 1) % n
    # Everything this rank receives, in order: segment (a, b) of chunk (r-step-1) at `step`.
    # It lands straight in place, so all the receives can be posted now, at no memory cost.
    arrivals = [(step, a, b) for step in range(n - 1) for a, b in segment_bounds(*bounds[(rank - step - 1) % n], seg)]
    pending = [irecv(x[a:b], left, group, tracer, name="allgather") for _, a, b in arrivals]
    sends = [isend(x[a:b], right, group, tracer, name="allgather") for a, b in segment_bounds(*bounds[rank], seg)]
    for (step, a, b), arrival in zip(arrivals, pending):
        arrival.wait()
        if step < n - 2:   # forward each segment as soon as it has arrived
            sends.append(isend(x[a:b], right, group, tracer, name="allgather"))
    for s in sends:
        s.wait()


def ring_reduce_scatter(tensor: torch.Tensor, op="sum", group=None, tracer: Tracer | None = None,
                        check: bool = True, segment_bytes: int = SEGMENT_BYTES, depth: int = DEPTH) -> torch.Tensor:
    """Reduce-scatter around the ring: returns this rank's chunk of the reduction,
    elements chunk_bounds(numel, N)[rank] of the flattened tensor (a view into `tensor`
    when it is contiguous and on a device the group's messages carry, else a copy).
    `tensor` is the workspace: its other chunks are left holding partial results."""
    op = prepare(tensor, op, group, tracer, check, what="ring_reduce_scatter", segment_bytes=segment_bytes, depth=depth)
    rank, n = group_rank(group), group_size(group)
    with flat_view(tensor, group) as x:                                   # (numel,)
        if n == 1 or x.numel() == 0:
            start, stop = chunk_bounds(x.numel(), n)[rank]
        else:
            seg = segment_elements(segment_bytes, x.element_size())
            start, stop = _reduce_scatter(x, op, rank, n, group, tracer, seg, depth)
        finish(x[start:stop], op, n, tracer)
        return x[start:stop]                                              # (chunk,)


def ring_allgather(tensor: torch.Tensor, group=None, tracer: Tracer | None = None, check: bool = True,
                   segment_bytes: int = SEGMENT_BYTES) -> torch.Tensor:
    """All-gather around the ring, in place: on entry chunk `rank` (chunk_bounds layout)
    of the flattened `tensor` holds this rank's data; on return every chunk c holds rank
    c's. Returns `tensor`. ring_reduce_scatter then ring_allgather = ring_allreduce."""
    prepare(tensor, None, group, tracer, check, what="ring_allgather", segment_bytes=segment_bytes)
    rank, n = group_rank(group), group_size(group)
    if n == 1 or tensor.numel() == 0:
        return tensor
    with flat_view(tensor, group) as x:
        _allgather(x, rank, n, group, tracer, segment_elements(segment_bytes, x.element_size()))
    return tensor


def ring_allreduce(tensor: torch.Tensor, op="sum", group=None, tracer: Tracer | None = None,
                   check: bool = True, segment_bytes: int = SEGMENT_BYTES, depth: int = DEPTH) -> torch.Tensor:
    """All-reduce `tensor` in place by ring reduce-scatter then ring all-gather; returns
    it. op and check as `naive_allreduce`; segment_bytes: the pipeline segment (every rank
    must pass the same); depth: reduce-scatter receives in flight.

    To compare it with torch.distributed's gloo all_reduce (itself a pipelined ring, 1 MiB
    segments, in C++) on your machine, run
    `python -m ddnb.bench allreduce --workers 4 --sizes 1MB,16MB,64MB --algorithms ring,torch`
    and read the `ratio_vs_torch` column (notebook 05 shows a stored run). Both spend their
    CPU time in the kernel's TCP copies, then in the ⊕. Each message costs this Python
    version more than gloo's C++ loop (posting, waking up to forward), so fewer, larger
    segments pay off here: SEGMENT_BYTES = 4 MiB was the best of 1, 2 and 4 MiB when it was
    chosen. At 16 MiB and 4 ranks a chunk is one 4 MiB segment, so the ⊕ is not overlapped
    with the transfer; that and the per-message cost are where it loses time to gloo."""
    op = prepare(tensor, op, group, tracer, check, what="ring_allreduce", segment_bytes=segment_bytes, depth=depth)
    rank, n = group_rank(group), group_size(group)
    if n == 1 or tensor.numel() == 0:
        return tensor
    with flat_view(tensor, group) as x:                                   # (numel,)
        seg = segment_elements(segment_bytes, x.element_size())
        start, stop = _reduce_scatter(x, op, rank, n, group, tracer, seg, depth)
        finish(x[start:stop], op, n, tracer)       # "avg": divide my chunk only, 1/N of the work
        _allgather(x, rank, n, group, tracer, seg)
    return tensor
