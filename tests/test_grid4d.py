"""ddnb.grid4d: the small GPT on one 16-worker dp x pp x tp x cp grid trains to the loss of
one process on the same global batch (Narayanan et al. 2021, Sec. 2.3 and 3).

One World of 16 ranks runs every layout in turn (the ProcessGrid and its groups made
anew each time). In the default run: every feasible dp x pp x tp x cp grid of 16
workers (26 for CONFIG), each with one of the eight (ZeRO stage, checkpointing) pairs in
turn and GPipe on every third; all eight pairs on dp2 x pp2 x tp2 x cp2 (and ZeRO-3,
checkpointing, GPipe over 4 micro-batches); two SGD runs (Adam's g/sqrt(v) hides a wrong
gradient scale; SGD shows it). DDNB_GRID4D_ALL=1 adds every grid x every ZeRO stage x
checkpointing on and off: 202 layouts, minutes on 2 cores."""
import os
from dataclasses import asdict

import pytest

from ddnb.grid4d import Layout, feasible_layouts, train_reference
from ddnb.models import GPTConfig
from ddnb.testing import World

CONFIG = GPTConfig(vocab_size=16, seq_len=8, d_model=16, n_heads=4, n_layers=4)   # tp <= 4, pp <= 4, cp <= 8
BATCH, STEPS, LR, SGD_LR = 16, 2, 1e-2, 1.0
TOL = 1e-4
PAIRS = [(z, c) for z in (0, 1, 2, 3) for c in (False, True)]


@pytest.fixture(scope="module")
def world16():
    w = World(16, timeout=120)
    yield w
    w.close()


def _train(layout: dict, optimizer: str, lr: float):
    from ddnb.grid4d import Layout, train_4d
    from ddnb.process_grid import ProcessGrid, reused_group

    lay = Layout(**layout)
    grid = ProcessGrid(dp=lay.dp, pp=lay.pp, tp=lay.tp, cp=lay.cp, new_group=reused_group)
    return train_4d(grid, CONFIG, lay, steps=STEPS, batch_size=BATCH, lr=lr, optimizer=optimizer)["losses"]


def _max_diff(world, layouts, optimizer="adam", lr=LR) -> dict:
    """{str(layout): the largest |loss - reference| over steps and ranks}."""
    ref = train_reference(CONFIG, steps=STEPS, batch_size=BATCH, lr=lr, optimizer=optimizer)["losses"]
    out = {}
    for lay in layouts:
        per_rank = world.run(_train, asdict(lay), optimizer, lr)
        assert all(r == per_rank[0] for r in per_rank), (str(lay), per_rank)   # one loss on every rank
        out[str(lay)] = max(abs(a - b) for a, b in zip(per_rank[0], ref))
        print(f"{out[str(lay)]:.2e}  {lay}", flush=True)                   # shown with pytest -s
    return out


def _sweep_layouts() -> list[Layout]:
    """Every feasible grid once, with (ZeRO stage, checkpointing) pair i of PAIRS in turn
    and GPipe on every third: every pair appears on at least three grids (and all of them
    on dp2 x pp2 x tp2 x cp2 in the next test)."""
    grids = feasible_layouts(16, CONFIG, BATCH, zero_stages=(0,))
    out = []
    for i, g in enumerate(grids):
        zero, ckpt = PAIRS[i % len(PAIRS)]
        if g.dp * g.cp == 1:
            zero = 0                                     # nothing to shard over
        out.append(Layout(g.dp, g.pp, g.tp, g.cp, zero, ckpt, g.microbatches,
                          "gpipe" if g.pp > 1 and i % 3 == 2 else "1f1b"))
    return out


# ------------------------------------------------------------------ no processes
def test_validate_lists_every_factor():
    with pytest.raises(ValueError, match=r"dp\(2\) \* pp\(2\) \* tp\(2\) \* cp\(2\) != world_size\(12\)"):
        Layout(2, 2, 2, 2).validate(CONFIG, world_size=12)


def test_validate_rejects_every_infeasible_rule_at_once():
    cfg = GPTConfig(vocab_size=15, seq_len=9, d_model=18, n_heads=3, n_layers=3)
    with pytest.raises(ValueError) as e:
        Layout(dp=1, pp=2, tp=2, cp=2, zero=1, microbatches=3).validate(cfg, world_size=8, batch_size=4)
    msg = str(e.value)
    for part in ("n_layers(3) % pp(2) = 1", "n_heads(3) % tp(2) = 1", "vocab_size(15) % tp(2) = 1",
                 "seq_len(9) % cp(2) = 1", "batch_size(4) % (dp(1) * microbatches(3)) = 1"):
        assert part in msg, (part, msg)
    with pytest.raises(ValueError, match=r"zero\(2\) with dp\(1\) \* cp\(1\) = 1 shards nothing"):
        Layout(pp=2, tp=2, zero=2, microbatches=2).validate(CONFIG, world_size=4, batch_size=8)
    with pytest.raises(ValueError, match=r"zero=4 is not one of"):
        Layout(dp=2, zero=4).validate(CONFIG, world_size=2)
    with pytest.raises(ValueError, match=r"optimizer='sgd': need 'adam', or 'sgd' with zero 0"):
        from ddnb.grid4d import train_4d
        from ddnb.process_grid import ProcessGrid

        train_4d(ProcessGrid(dp=2, world_size=2, rank=0), CONFIG, Layout(dp=2, zero=1), optimizer="sgd")


def test_feasible_layouts_of_16_workers():
    grids = feasible_layouts(16, CONFIG, BATCH, zero_stages=(0,))
    shapes = {(g.dp, g.pp, g.tp, g.cp) for g in grids}
    assert len(grids) == 26                              # 35 ordered factorizations - pp 8/16, tp 8/16, cp 16
    assert (2, 2, 2, 2) in shapes and (16, 1, 1, 1) in shapes and (1, 4, 4, 1) in shapes
    assert not any(pp > 4 or tp > 4 or cp > 8 for _, pp, tp, cp in shapes)
    assert all(g.microbatches == g.pp for g in grids)    # B/dp rows split into pp micro-batches
    every = feasible_layouts(16, CONFIG, BATCH)
    assert len(every) == 26 * 4 - 3                      # zero 1-3 need dp x cp > 1: not on dp1 pp4 tp4 cp1


def test_ranks_over_dp_and_cp_hold_the_same_parameters():
    from ddnb.process_grid import ProcessGrid

    grid = ProcessGrid(dp=2, pp=2, tp=2, cp=2, world_size=16, rank=5)      # pp 0, dp 1, cp 0, tp 1
    assert grid.ranks_over(("dp", "cp")) == [1, 3, 5, 7]
    assert grid.ranks_over(("dp",)) == grid.ranks("dp") == [1, 5]


def test_layout_from_a_planner_row():
    from ddnb.cost.planner import plan

    rows = [r for r in plan(CONFIG, "ib", workers=16, memory_per_worker=1e12, global_batch=BATCH)
            if r["fits"] and r["chunks"] == 1]
    assert rows
    for row in rows[:20]:
        lay = Layout.from_plan(row, BATCH)
        assert (lay.dp, lay.pp, lay.tp, lay.cp, lay.zero, lay.checkpointing) == tuple(
            row[k] for k in ("dp", "pp", "tp", "cp", "zero", "checkpointing"))
        assert lay.microbatches == row["microbatches"]
        assert lay.problems(CONFIG, 16, BATCH) == [] or any("n_layers" in p or "seq_len" in p
                                                             for p in lay.problems(CONFIG, 16, BATCH))
    with pytest.raises(ValueError, match=r"chunks\(2\) > 1 \(interleaved 1F1B\) is not run"):
        Layout.from_plan({**rows[0], "chunks": 2}, BATCH)


# ------------------------------------------------------------------ 16 processes
def test_every_16_worker_grid_trains_to_the_one_process_loss(world16):
    diffs = _max_diff(world16, _sweep_layouts())
    assert len(diffs) == 26
    assert max(diffs.values()) < TOL, {k: d for k, d in diffs.items() if d >= TOL}


def test_every_zero_stage_and_checkpointing_on_2x2x2x2(world16):
    layouts = [Layout(2, 2, 2, 2, z, c, 2) for z, c in PAIRS] + [Layout(2, 2, 2, 2, 3, True, 4, "gpipe")]
    diffs = _max_diff(world16, layouts)
    assert max(diffs.values()) < TOL, diffs


def test_sgd_shows_the_gradient_scale(world16):
    """A gradient 2x too large moves this step-2 loss by 0.027 under SGD(lr=1), by ~0 under Adam."""
    diffs = _max_diff(world16, [Layout(2, 2, 2, 2, 0, False, 2), Layout(4, 1, 2, 2, 0, True, 1)], "sgd", SGD_LR)
    assert max(diffs.values()) < TOL, diffs


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.skipif(not os.environ.get("DDNB_GRID4D_ALL"), reason="every layout takes minutes: DDNB_GRID4D_ALL=1")
def test_every_feasible_layout_with_every_zero_stage(world16):
    layouts = feasible_layouts(16, CONFIG, BATCH, checkpointing=(False, True))
    diffs = _max_diff(world16, layouts)
    assert max(diffs.values()) < TOL, {k: d for k, d in diffs.items() if d >= TOL}
