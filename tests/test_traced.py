"""The one traced layer over torch.distributed's collectives (`ddnb.collectives.traced`):
results equal torch's, events carry the bytes and fields asked for, and every user of it
(tensor and sequence parallelism, compression) stamps its events on one clock, the
emulated one in an emulated cluster (tensor parallelism stamped time.time() before)."""
import pytest
import torch

from ddnb.emulate import custom
from ddnb.testing import World

PROFILE = custom(alpha=1e-3, bandwidth=1e8, peak_flops=1e9, efficiency=1.0, memory_bandwidth=1e12, slowdown=20)


def _every_op():
    import torch.distributed as dist

    from ddnb.collectives import traced
    from ddnb.compression.comm import allreduce
    from ddnb.tensor_parallel.comms import all_gather_last
    from ddnb.tensor_parallel.comms import all_reduce as tp_all_reduce
    from ddnb.trace import Tracer

    r, tracer = dist.get_rank(), Tracer()
    x = torch.full((2, 3), float(r + 1))
    summed = traced.all_reduce(x.clone(), tracer=tracer, name="s", step=7)
    stacked = traced.all_gather(x, tracer=tracer)
    chunk = traced.reduce_scatter([x * (k + 1) for k in range(dist.get_world_size())], tracer=tracer)
    traced.barrier(tracer=tracer)
    tp = tp_all_reduce(x.clone(), tracer=tracer, name="g")
    wide = all_gather_last(x, tracer=tracer)
    comp = allreduce(x.clone().reshape(-1), tracer=tracer, name="c")
    return summed, stacked, chunk, tp, wide, comp, list(tracer.events)


@pytest.mark.parametrize("emulate", [None, PROFILE], ids=["real", "emulated"])
def test_results_events_and_one_clock(emulate):
    with World(3, emulate=emulate, timeout=120) as w:
        out = w.run(_every_op)
        reports = w.emulation_reports() if emulate else None
    n, total = 3, torch.full((2, 3), 6.0)
    for r, (summed, stacked, chunk, tp, wide, comp, events) in enumerate(out):
        assert torch.equal(summed, total) and torch.equal(tp, total) and torch.equal(comp, total.reshape(-1))
        assert torch.equal(stacked, torch.stack([torch.full((2, 3), k + 1.0) for k in range(n)]))
        assert torch.equal(chunk, total * (r + 1))
        assert torch.equal(wide, torch.cat([torch.full((2, 3), k + 1.0) for k in range(n)], dim=-1))
        ops = [(e["name"], e["op"], e["nbytes"]) for e in events]
        assert ops == [("s", "all_reduce", 24), ("all_gather", "all_gather", 24),
                       ("reduce_scatter", "reduce_scatter", 24), ("barrier", "barrier", 0),
                       ("all_reduce g forward", "all_reduce", 24), ("all_gather forward", "all_gather", 24),
                       ("c", "all_reduce", 24)]
        assert events[0]["step"] == 7 and events[4]["phase"] == "forward"
        starts = [e["start"] for e in events]
        assert starts == sorted(starts)
        if emulate:   # emulated seconds since the cluster's epoch, not time.time()'s ~1.7e9
            assert all(0 <= e["start"] <= e["end"] < 1e5 for e in events)
            ring = 2 * (n - 1) * 1e-3                     # the ring's latency terms alone, alpha = 1 ms
            assert events[0]["end"] - events[0]["start"] >= ring
    if emulate:
        assert all(r["overruns"] == 0 for r in reports)


def _broadcast_and_all_to_all(src):
    import torch.distributed as dist

    from ddnb.collectives import traced
    from ddnb.emulate import current
    from ddnb.trace import Tracer

    rank, n = dist.get_rank(), dist.get_world_size()
    tr = Tracer()
    x = torch.full((4,), float(rank))
    traced.broadcast(x, src, tracer=tr)
    inp = torch.arange(n * 2, dtype=torch.float32) + 100 * rank      # chunk j -> rank j
    out = torch.empty_like(inp)
    traced.all_to_all(out, inp, tracer=tr)
    rs = traced.reduce_scatter([torch.full((2,), float(rank + j)) for j in range(n)], tracer=tr)
    em = current()
    return x.tolist(), out.tolist(), rs.tolist(), [e["op"] for e in tr.take()], em.messages if em else None


@pytest.mark.parametrize("emulate", [None, "slow"])
def test_broadcast_all_to_all_and_reduce_scatter_are_torchs_and_timed_by_messages_when_emulated(emulate):
    from ddnb.emulate import custom

    profile = custom(alpha=1e-4, bandwidth=1e9, slowdown=10) if emulate else None
    with World(3, emulate=profile, timeout=60) as w:
        out = w.run(_broadcast_and_all_to_all, 1)
    for rank, (x, got, rs, ops, messages) in enumerate(out):
        assert x == [1.0] * 4
        assert got == [2 * rank + k + 100 * i for i in range(3) for k in range(2)]
        assert rs == [float(sum(r + rank for r in range(3)))] * 2        # chunk `rank` summed over ranks
        assert ops == ["broadcast", "all_to_all", "reduce_scatter"]
        assert (messages is None) == (not emulate)
    if emulate:   # timed by messages: the tree sends one to each of the 2 other ranks, the all-to-all and
        assert sum(m for *_, m in out) == 2 + 3 * 2 + 3 * 2    # the ring reduce-scatter 2 per rank
