"""All-reduce, built from point-to-point messages only (`p2p.py`), naive first:

    naive_allreduce              gather to rank 0, reduce, send back        naive.py
    tree_allreduce               binomial-tree reduce + broadcast           tree.py
    ring_allreduce               ring reduce-scatter + all-gather           ring.py
    halving_doubling_allreduce   recursive halving + recursive doubling     halving_doubling.py

Each has torch.distributed's call shape, `fn(tensor, op="sum", group=None, tracer=None)`:
it reduces `tensor` in place on every rank of `group` and returns it, recording every
message (and the reduction arithmetic) in the tracer. Ops and the cross-rank input
check live in `ops.py`; each algorithm's messages, step by step, as plain data in
`schedules.py` (`allreduce_schedule`), which tests check against the traced messages;
`compare.py` checks an all-reduce written in a notebook cell against ddnb's and torch's;
`wire.py` counts the bytes a rank sends in one of them, from its trace.
Then all-to-all, from the same messages:

    all_to_all                   pairwise exchange, N-1 rounds, uneven splits too   all_to_all.py
    bruck_all_to_all             Bruck's algorithm, ceil(log2 N) rounds, equal splits

with torch.distributed.all_to_all_single's call shape, `fn(output, input, ...,
group=None, tracer=None)`. Taught in `notebooks/03_collectives.ipynb` and
`notebooks/05_allreduce.ipynb`.
"""
from ddnb.collectives.all_to_all import ALL_TO_ALLS, all_to_all, bruck_all_to_all
from ddnb.collectives.halving_doubling import halving_doubling_allreduce
from ddnb.collectives.naive import naive_allreduce
from ddnb.collectives.ops import OPS
from ddnb.collectives.ring import chunk_bounds, ring_allgather, ring_allreduce, ring_reduce_scatter
from ddnb.collectives.schedules import Message, allreduce_schedule
from ddnb.collectives.tree import broadcast, reduce, tree_allreduce

ALLREDUCES = {
    "naive": naive_allreduce,
    "tree": tree_allreduce,
    "ring": ring_allreduce,
    "halving_doubling": halving_doubling_allreduce,
}

__all__ = ["ALLREDUCES", "ALL_TO_ALLS", "Message", "OPS", "all_to_all", "allreduce_schedule", "broadcast",
           "bruck_all_to_all", "chunk_bounds",
           "halving_doubling_allreduce", "naive_allreduce", "reduce", "ring_allgather", "ring_allreduce",
           "ring_reduce_scatter", "tree_allreduce"]
