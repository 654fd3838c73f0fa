"""ddnb.ProcessGrid: coordinates (tp fastest, then dp, pp slowest), the ranks of every
axis's groups, validation that lists each factor; pure arithmetic without processes,
plus one 4-rank test that the groups it builds reduce over the right ranks."""
import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

import ddnb
from ddnb.process_grid import ProcessGrid


def test_exported_from_ddnb():
    assert ddnb.ProcessGrid is ProcessGrid


def test_coordinates_tp_fastest_then_dp_then_pp():
    grid = ProcessGrid(dp=2, pp=2, tp=2, world_size=8, rank=0)
    assert [tuple(grid.coords(r))[:3] for r in range(8)] == [   # (dp, pp, tp); cp = ep = 0
        (0, 0, 0), (0, 0, 1), (1, 0, 0), (1, 0, 1), (0, 1, 0), (0, 1, 1), (1, 1, 0), (1, 1, 1)]
    assert grid.coords(5)._asdict() == {"dp": 0, "pp": 1, "tp": 1, "cp": 0, "ep": 0}


def test_groups_of_each_axis():
    grid = ProcessGrid(dp=2, pp=2, tp=2, world_size=8, rank=5)
    assert grid.ranks("tp") == [4, 5]
    assert grid.ranks("dp") == [5, 7]
    assert grid.ranks("pp") == [1, 5]
    assert grid.all_ranks("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert grid.all_ranks("dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert grid.all_ranks("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    dp_tp = ProcessGrid(dp=2, tp=2, world_size=4, rank=0)
    assert dp_tp.all_ranks("tp") == [[0, 1], [2, 3]] and dp_tp.all_ranks("dp") == [[0, 2], [1, 3]]
    assert dp_tp.all_ranks("pp") == [[0], [1], [2], [3]]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4), st.data())
def test_every_axis_partitions_the_world(dp, pp, tp, data):
    n = dp * pp * tp
    grid = ProcessGrid(dp=dp, pp=pp, tp=tp, world_size=n, rank=data.draw(st.integers(0, n - 1)))
    for axis, size in (("dp", dp), ("pp", pp), ("tp", tp)):
        groups = grid.all_ranks(axis)
        assert len(groups) == n // size and all(len(g) == size for g in groups)
        assert sorted(r for g in groups for r in g) == list(range(n))
    for r in range(n):
        assert grid.rank_of(**grid.coords(r)._asdict()) == r
        assert r in grid.ranks("tp", r) and r in grid.ranks("dp", r) and r in grid.ranks("pp", r)


def test_bad_sizes_list_every_factor():
    with pytest.raises(ValueError, match=r"dp\(2\) \* pp\(2\) \* tp\(2\) != world_size\(6\)"):
        ProcessGrid(dp=2, pp=2, tp=2, world_size=6)
    with pytest.raises(ValueError, match=r"dp=0.*tp=1.5"):
        ProcessGrid(dp=0, tp=1.5, world_size=4)
    with pytest.raises(ValueError, match=r"rank\(4\) is not in \[0, world_size\(4\)\)"):
        ProcessGrid(dp=4, world_size=4, rank=4)
    with pytest.raises(ValueError, match=r"^ProcessGrid: dp, pp and tp must be integers >= 1, .*\(dp is not\); "
                                         r"world_size=0: need an integer >= 1$"):
        ProcessGrid(dp=0, world_size=0)
    grid = ProcessGrid(dp=2, tp=2, world_size=4)
    with pytest.raises(ValueError, match=r"dp=2 is not in \[0, dp\(2\)\).*; tp=-1 is not in \[0, tp\(2\)\)"):
        grid.rank_of(dp=2, tp=-1)
    with pytest.raises(ValueError, match="axis='xp'"):
        grid.ranks("xp")
    with pytest.raises(ValueError, match=r"tp=2 is not in \[0, tp\(2\)\)"):
        grid.rank_of(tp=2)
    with pytest.raises(RuntimeError, match="no process groups"):
        grid.group("tp")


def grid_case():
    """Sum each rank's id over its tp and dp groups, and check the grid's validation runs
    before any group is made (a bad grid raises on every rank, nobody blocks)."""
    try:
        ProcessGrid(dp=3, tp=2)
        bad = None
    except ValueError as e:
        bad = str(e)
    grid = ProcessGrid(dp=2, tp=2)
    out = {"bad": bad, "coords": tuple(grid.coords())}
    for axis in ("tp", "dp", "pp"):
        t = torch.tensor([float(dist.get_rank())])
        dist.all_reduce(t, group=grid.group(axis))
        out[axis] = t.item()
    return out


def test_groups_reduce_over_the_right_ranks(world):
    res = world(4).run(grid_case)
    assert all(r["bad"] == "ProcessGrid: dp(3) * pp(1) * tp(2) != world_size(4): the grid has 6 positions for "
                           "4 ranks" for r in res)
    assert [r["coords"][:3] for r in res] == [(0, 0, 0), (0, 0, 1), (1, 0, 0), (1, 0, 1)]
    assert [r["tp"] for r in res] == [1.0, 1.0, 5.0, 5.0]      # [0, 1] and [2, 3]
    assert [r["dp"] for r in res] == [2.0, 4.0, 2.0, 4.0]      # [0, 2] and [1, 3]
    assert [r["pp"] for r in res] == [0.0, 1.0, 2.0, 3.0]      # pp=1: each rank alone


def test_cp_and_ep_axes_between_tp_and_dp():
    grid = ProcessGrid(dp=2, tp=2, cp=2, ep=2, world_size=16, rank=0)
    assert grid.coords(13)._asdict() == {"dp": 1, "pp": 0, "tp": 1, "cp": 0, "ep": 1}   # 13 = ((1·2+1)·2+0)·2+1
    assert grid.all_ranks("cp")[:2] == [[0, 2], [1, 3]] and grid.all_ranks("ep")[:2] == [[0, 4], [1, 5]]
    assert grid.ranks("dp", 13) == [5, 13]
    for r in range(16):
        assert grid.rank_of(**grid.coords(r)._asdict()) == r
    assert ProcessGrid(dp=2, ep=2, world_size=4, rank=0).all_ranks("ep") == [[0, 1], [2, 3]]
    assert "ep=2" in repr(ProcessGrid(dp=2, ep=2, world_size=4, rank=3))
    with pytest.raises(ValueError, match=r"^ProcessGrid: dp\(2\) \* pp\(1\) \* tp\(1\) \* cp\(3\) \* ep\(2\) != "
                                         r"world_size\(8\): the grid has 12 positions for 8 ranks$"):
        ProcessGrid(dp=2, cp=3, ep=2, world_size=8)
    with pytest.raises(ValueError, match=r"dp, pp, tp, cp and ep must be integers >= 1, got dp=1, pp=1, tp=1, "
                                         r"cp=0, ep=1.5 \(cp and ep are not\)"):
        ProcessGrid(cp=0, ep=1.5, world_size=4)
    with pytest.raises(ValueError, match=r"cp=2 is not in \[0, cp\(1\)\)"):
        ProcessGrid(dp=4, world_size=4).rank_of(cp=2)


def test_dp_by_ep_training_equals_one_process(world):
    from ddnb.expert_parallel.training import train_dp_ep, train_moe_reference

    out = world(4).run(train_dp_ep_case)
    ref = train_moe_reference(steps=3)
    for r, (losses, params) in enumerate(out):
        assert max(abs(a - b) for a, b in zip(losses, ref["losses"])) < 1e-5
        for name, p in params.items():
            assert (p - ref["params"][r][name]).abs().max() < 1e-5, (r, name)
    assert callable(train_dp_ep)


def train_dp_ep_case():
    from ddnb.expert_parallel.training import train_dp_ep

    out = train_dp_ep(ProcessGrid(dp=2, ep=2), steps=3)
    return out["losses"], {k: p.detach() for k, p in out["model"].named_parameters()}
