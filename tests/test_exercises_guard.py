"""ddnb.exercises.guard: inside `refuse_collectives` torch.distributed's collectives and
ddnb's own raise with the exercise's hint, allowed ones pass and are counted, p2p sends
are counted once each per destination; every name is restored on exit, also after a
raise. `ship`/`land` rebuild a learner's function with fresh globals each time."""
import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

import ddnb.collectives
import ddnb.collectives.ring
from ddnb.exercises.core import run_on_ranks
from ddnb.exercises.guard import ALL_GATHERS, Refused, held_outside, land, refuse_collectives, ship


def originals():
    return {"dist.all_reduce": dist.all_reduce, "c10d.all_reduce": c10d.all_reduce, "dist.isend": dist.isend,
            "c10d.isend": c10d.isend, "dist.all_gather": dist.all_gather,
            "dist.batch_isend_irecv": dist.batch_isend_irecv,
            "ddnb.collectives.ring_allreduce": ddnb.collectives.ring_allreduce,
            "ddnb.collectives.ring.ring_allreduce": ddnb.collectives.ring.ring_allreduce,
            "ALLREDUCES['ring']": ddnb.collectives.ALLREDUCES["ring"]}


def test_refused_inside_and_restored_after_a_raise():
    before = originals()
    with pytest.raises(ZeroDivisionError):
        with refuse_collectives(allow=("all_gather",), why="the ring is the exercise"):
            with pytest.raises(Refused, match=r"^dist\.all_reduce is off in this exercise: the ring is the exercise$"):
                dist.all_reduce(torch.ones(1))
            with pytest.raises(Refused, match=r"^dist\.all_reduce is off"):
                c10d.all_reduce(torch.ones(1))
            for refused in (ddnb.collectives.ring_allreduce, ddnb.collectives.ring.ring_allreduce,
                            ddnb.collectives.ALLREDUCES["ring"]):
                with pytest.raises(Refused, match=r"^ddnb\.collectives\.ring_allreduce is off in this exercise"):
                    refused(torch.ones(1))
            assert dist.all_gather.__wrapped__ is before["dist.all_gather"]        # allowed: passes through
            assert {k for k, v in originals().items() if v is before[k]} == set()  # every one replaced
            1 / 0                                                                   # the learner's code raises
    assert {k for k, v in originals().items() if v is not before[k]} == set()      # every one back


def test_unknown_allowed_names_are_listed():
    with pytest.raises(ValueError, match=r"allow=\('all_gather', 'allreduce', 'bcast'\): \['allreduce', 'bcast'\] "
                                         r"are not among"):
        with refuse_collectives(allow=("all_gather", "allreduce", "bcast")):
            pass


def sends_three_ways():
    """On a rank: 7 float32 by send, 3 float64 by isend, 2 int64 by batch_isend_irecv, to
    the right; 5 float32 handed to an allowed all_gather."""
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    bufs = [torch.empty(7), torch.empty(3, dtype=torch.float64), torch.empty(2, dtype=torch.int64)]
    with refuse_collectives(allow=ALL_GATHERS) as wire:
        r0 = dist.irecv(bufs[0], left)
        dist.send(torch.ones(7), right)
        r0.wait()
        for r in (dist.isend(torch.ones(3, dtype=torch.float64), right), dist.irecv(bufs[1], left)):
            r.wait()
        ops = [dist.P2POp(dist.isend, torch.ones(2, dtype=torch.int64), right), dist.P2POp(dist.irecv, bufs[2], left)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        out = [torch.empty(5) for _ in range(n)]
        dist.all_gather(out, torch.full((5,), float(rank)))
        try:
            dist.all_reduce(torch.ones(1))
        except Refused as e:
            refused = str(e)
    gathered = torch.stack(out)[:, 0].tolist()
    restored = dist.all_reduce is c10d.all_reduce and not hasattr(dist.isend, "__wrapped__")
    return dict(wire.sent_to), dict(wire.messages), dict(wire.handed), gathered, refused, restored


def test_sends_are_counted_once_per_destination_on_real_ranks():
    got = run_on_ranks(sends_three_ways, 3)
    for rank, (sent_to, messages, handed, gathered, refused, restored) in enumerate(got):
        assert sent_to == {(rank + 1) % 3: 7 * 4 + 3 * 8 + 2 * 8} and messages == {(rank + 1) % 3: 3}
        assert handed == {"all_gather": 5} and gathered == [0.0, 1.0, 2.0]
        assert refused.startswith("dist.all_reduce is off in this exercise") and restored


COUNTER = {}


def keeps_a_global_count(x):
    COUNTER["calls"] = COUNTER.get("calls", 0) + 1
    COUNTER["seen"] = torch.as_tensor(x, dtype=torch.float64).reshape(1)
    return COUNTER["calls"]


def test_a_landed_function_starts_with_fresh_globals_every_time():
    blob = ship(keeps_a_global_count)
    fns = [land(blob) for _ in range(2)]
    before = held_outside(fns[0])
    assert [fns[0](1.0), fns[0](2.0), fns[1](3.0)] == [1, 2, 1]           # the second landing forgot the calls
    assert before == {"global 'COUNTER'": (0, 0.0)} and held_outside(fns[0]) == {"global 'COUNTER'": (1, 2.0)}
    assert COUNTER == {}                                                  # the shipped copies, not this module's


def test_ddnb_library_functions_travel_by_reference():
    assert land(ship(ddnb.collectives.ring_allreduce)) is ddnb.collectives.ring_allreduce
    with refuse_collectives():
        with pytest.raises(Refused, match="ddnb.collectives.ring_allreduce is off"):
            land(ship(ddnb.collectives.ring_allreduce))(torch.ones(1))
