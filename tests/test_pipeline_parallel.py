"""ddnb.pipeline_parallel: the schedules are valid (each micro-batch's F before its B on
every stage, F(j) after F(j) upstream and B(j) after B(j) downstream, 1F1B never more
than p - rank micro-batches in flight; interleaved 1F1B over virtual stages) and broken
ones are refused; one pipeline step gives the gradients (1e-5) of one process running
the unsplit GPT on the whole batch (loss averaged over micro-batches), for GPipe and
1F1B, p in {2, 3, 4}, m in {1, 4, 8}, and the gradients of torch.distributed.pipelining's
ScheduleGPipe / Schedule1F1B (interleaved: ScheduleInterleaved1F1B); a few
SGD steps train to the single-process parameters and the loss falls; the measured peak
activations of stage r are m micro-batches under GPipe and p - r under 1F1B (exact bytes:
deterministic on CPU); every F and B is traced; bad input raises ValueError on every rank
before any message; the pipeline plots and the widget draw from plain data.

Every distributed test is one World.run on the session's 4-rank world; p = 2 and 3 run on
subgroups of its last ranks (so group ranks differ from global ranks).
"""
import matplotlib

matplotlib.use("Agg")

import pytest
import torch
import torch.distributed as dist

from ddnb.models import GPTConfig, gpt, lm_loss, synthetic_task
from ddnb.pipeline_parallel import (Action, PipelineStage, bubble_fraction, get_schedule, gpipe_schedule, in_flight,
                                    interleaved_one_f_one_b_schedule, one_f_one_b_schedule, partition_layers,
                                    reference_grads, run_schedule, simulate, torch_pipeline_grads, validate_schedule)

CFG = GPTConfig(n_layers=2)        # Embedding, 2 Blocks, Head: 4 layers, up to 4 stages
BATCH = 8                          # divisible by m in {1, 4, 8}


# ---------------------------------------------------------------- schedules on paper
@pytest.mark.parametrize("make", [gpipe_schedule, one_f_one_b_schedule])
@pytest.mark.parametrize("p", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 8])
def test_schedules_are_valid(make, p, m):
    schedule = make(p, m)
    validate_schedule(schedule, m)
    for r, acts in enumerate(schedule):
        assert sorted(acts) == sorted([Action("F", j) for j in range(m)] + [Action("B", j) for j in range(m)])
        assert all(acts.index(Action("F", j)) < acts.index(Action("B", j)) for j in range(m))
    # dependencies across stages, in the simulated run
    end = {(e["rank"], e["op"], e["microbatch"]): e for e in simulate(schedule)}
    for r in range(p):
        for j in range(m):
            if r > 0:
                assert end[(r, "F", j)]["start"] >= end[(r - 1, "F", j)]["end"]
            if r < p - 1:
                assert end[(r, "B", j)]["start"] >= end[(r + 1, "B", j)]["end"]


@pytest.mark.parametrize("p, m", [(1, 3), (2, 2), (2, 6), (3, 3), (3, 9), (4, 4), (4, 8)])
@pytest.mark.parametrize("v", [2, 3])
def test_interleaved_schedules_are_valid(p, m, v):
    schedule = interleaved_one_f_one_b_schedule(p, m, v)
    validate_schedule(schedule, m)
    everything = sorted(Action(op, j, c) for op in "FB" for j in range(m) for c in range(v))
    end = {(e["rank"], Action(e["op"], e["microbatch"], e["chunk"])): e for e in simulate(schedule)}
    for r, acts in enumerate(schedule):
        assert sorted(acts) == everything
        for j in range(m):
            for c in range(v):
                s = c * p + r                                   # virtual stage
                assert acts.index(Action("F", j, c)) < acts.index(Action("B", j, c))
                up, down = s - 1, s + 1                         # neighbours, wrapping rank p-1 -> 0
                if s > 0:
                    assert end[(r, Action("F", j, c))]["start"] >= end[(up % p, Action("F", j, up // p))]["end"]
                if s < p * v - 1:
                    assert end[(r, Action("B", j, c))]["start"] >= end[(down % p, Action("B", j, down // p))]["end"]
    assert interleaved_one_f_one_b_schedule(p, m, 1) == one_f_one_b_schedule(p, m)
    assert repr(schedule[0][0]) == "F0" and repr(Action("B", 3, 1)) == "B3.1"


@pytest.mark.parametrize("p", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("m", [1, 2, 4, 8, 16])
def test_in_flight_gpipe_m_1f1b_at_most_p_minus_rank(p, m):
    assert [in_flight(a) for a in gpipe_schedule(p, m)] == [m] * p
    got = [in_flight(a) for a in one_f_one_b_schedule(p, m)]
    assert all(n <= p - r for r, n in enumerate(got))
    assert got == [min(p - r, m) for r in range(p)]


def test_one_f_one_b_shape_by_hand():
    assert one_f_one_b_schedule(3, 4) == [
        [Action("F", 0), Action("F", 1), Action("F", 2), Action("B", 0), Action("F", 3), Action("B", 1),
         Action("B", 2), Action("B", 3)],
        [Action("F", 0), Action("F", 1), Action("B", 0), Action("F", 2), Action("B", 1), Action("F", 3),
         Action("B", 2), Action("B", 3)],
        [Action("F", 0), Action("B", 0), Action("F", 1), Action("B", 1), Action("F", 2), Action("B", 2),
         Action("F", 3), Action("B", 3)]]
    assert repr(gpipe_schedule(2, 2)[0]) == "[F0, F1, B0, B1]"


@pytest.mark.parametrize("schedule, words", [
    ([[Action("B", 0), Action("F", 0)]], ["rank 0: B0 before F0"]),
    ([[Action("F", 0), Action("F", 0)]], ["rank 0", "once"]),
    ([[Action("F", 0), Action("B", 0), Action("F", 1), Action("B", 1)],      # rank 0 waits for B0,
      [Action("F", 0), Action("F", 1), Action("B", 0), Action("B", 1)]],     # rank 1 for F1
     ["deadlocks", "rank 0 at B0", "rank 1 at F1"]),
    ([[Action("F", 1), Action("F", 0), Action("B", 0), Action("B", 1)],
      [Action("F", 0), Action("F", 1), Action("B", 0), Action("B", 1)]], ["forward order [0, 1] differs"]),
])
def test_broken_schedules_are_refused(schedule, words):
    m = len(schedule[0]) // 2
    with pytest.raises(ValueError) as err:
        validate_schedule(schedule, m)
    assert all(w in str(err.value) for w in words), str(err.value)


def test_partition_and_bad_counts():
    assert partition_layers(8, 4) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert partition_layers(6, 4) == [(0, 2), (2, 4), (4, 5), (5, 6)]
    with pytest.raises(ValueError, match=r"more stages than layers: stages\(5\) > layers\(4\)"):
        partition_layers(4, 5)
    with pytest.raises(ValueError, match="microbatches=0"):
        gpipe_schedule(2, 0)
    with pytest.raises(ValueError, match="'zb'"):
        get_schedule("zb", 2, 2)
    with pytest.raises(ValueError, match=r"^get_schedule: schedule='zb' is not one of .*; stages=0: need an integer "
                                         r">= 1; microbatches=1.5: need an integer >= 1$"):
        get_schedule("zb", 0, 1.5)
    with pytest.raises(ValueError, match=r"chunks=0: need an integer >= 1; interleaved 1F1B needs microbatches a "
                                         r"multiple of stages, got microbatches\(6\) % stages\(4\) = 2"):
        get_schedule("interleaved", 4, 6, chunks=0)


# ---------------------------------------------------------------- on a real pipeline
def _group(p):
    """A group of the last p ranks of the world (WORLD for p = world size); None off it."""
    n, rank = dist.get_world_size(), dist.get_rank()
    group = dist.group.WORLD if p == n else dist.new_group(list(range(n - p, n)))
    return group if rank >= n - p else None


def _slice(grads, model, stage):
    first = sum(1 for _ in model[:stage.start].parameters())
    return grads[first:first + sum(1 for _ in stage.module.parameters())]


def pipeline_vs_references(p, ms=(1, 4, 8), with_torch=True):
    """On each rank of a p-rank group: for both schedules and each m, max |grad - single
    process| and |grad - torch.distributed.pipelining| over this stage's parameters, and
    the losses."""
    group = _group(p)
    if group is None:
        return None
    rank = dist.get_rank(group)
    idx, targets = synthetic_task(CFG, batch_size=BATCH, steps=1, seed=3)[0]
    out = {}
    for name in ("gpipe", "1f1b"):
        for m in ms:
            model = gpt(CFG, seed=1)
            stage = PipelineStage(model, m, idx.shape, group=group)
            res = run_schedule(stage, get_schedule(name, p, m), idx if stage.is_first else None,
                               targets if stage.is_last else None, lm_loss)
            mine = [q.grad for q in stage.module.parameters()]
            ref_loss, ref = reference_grads(gpt(CFG, seed=1), idx, targets, lm_loss, m)
            err = max((a - b).abs().max().item() for a, b in zip(mine, _slice(ref, model, stage)))
            terr = tloss = None
            if with_torch and (name == "gpipe" or m >= p):   # torch's Schedule1F1B refuses m < p
                tloss, tg = torch_pipeline_grads(gpt(CFG, seed=1), name, idx if rank == 0 else None,
                                                 targets if rank == p - 1 else None, lm_loss, m, group=group)
                terr = max((a - b).abs().max().item() for a, b in zip(mine, tg))
            out[(name, m)] = (err, terr, res.loss, ref_loss, tloss, res.in_flight)
    return rank, out


@pytest.mark.parametrize("p", [2, 3, 4])
def test_gradients_equal_single_process_and_torch_pipelining(world, p):
    results = [r for r in world(4).run(pipeline_vs_references, p) if r is not None]
    assert [rank for rank, _ in results] == list(range(p))
    for rank, out in results:
        for (name, m), (err, terr, loss, ref_loss, tloss, held) in out.items():
            assert err < 1e-5, (name, m, rank, err)
            if terr is not None:
                assert terr < 1e-5, (name, m, rank, terr)
            assert held == (m if name == "gpipe" else min(p - rank, m))
            if rank == p - 1:
                assert loss == pytest.approx(ref_loss, abs=1e-6)
                if tloss is not None:
                    assert tloss == pytest.approx(ref_loss, abs=1e-6)
            else:
                assert loss is None


def interleaved_vs_references(p, m, v=2):
    """Interleaved 1F1B with v chunks per rank on a p-rank group: max |grad - single
    process| and |grad - ScheduleInterleaved1F1B| over this rank's parameters."""
    group = _group(p)
    if group is None:
        return None
    rank = dist.get_rank(group)
    cfg = GPTConfig(n_layers=6)                      # 8 layers: up to 8 virtual stages
    idx, targets = synthetic_task(cfg, batch_size=BATCH, steps=1, seed=4)[0]
    model = gpt(cfg, seed=1)
    stages = [PipelineStage(model, m, idx.shape, group=group, chunk=c, chunks=v) for c in range(v)]
    res = run_schedule(stages, interleaved_one_f_one_b_schedule(p, m, v), idx, targets, lm_loss)
    mine = [q.grad for st in stages for q in st.module.parameters()]
    ref_loss, ref = reference_grads(gpt(cfg, seed=1), idx, targets, lm_loss, m)
    layer_of = [int(name.split(".")[0]) for name, _ in model.named_parameters()]
    ref = [g for st in stages for g, layer in zip(ref, layer_of) if st.start <= layer < st.end]
    tloss, theirs = torch_pipeline_grads(gpt(cfg, seed=1), "interleaved", idx, targets, lm_loss, m, group=group,
                                         chunks=v)
    return (rank, max((a - b).abs().max().item() for a, b in zip(mine, ref)),
            max((a - b).abs().max().item() for a, b in zip(mine, theirs)), res.loss, ref_loss, tloss, res.in_flight)


@pytest.mark.parametrize("p, m, v", [(2, 4, 2), (2, 8, 4), (4, 4, 2), (4, 8, 2)])
def test_interleaved_gradients_equal_single_process_and_torch(world, p, m, v):
    from ddnb.cost import peak_microbatches_in_flight

    results = [r for r in world(4).run(interleaved_vs_references, p, m, v) if r is not None]
    assert [r[0] for r in results] == list(range(p))
    for rank, err, terr, loss, ref_loss, tloss, held in results:
        assert err < 1e-5 and terr < 1e-5, (rank, err, terr)
        assert held == peak_microbatches_in_flight("interleaved", p, m, rank, chunks=v)
        if rank == p - 1:
            assert loss == pytest.approx(ref_loss, abs=1e-6) and tloss == pytest.approx(ref_loss, abs=1e-6)


def train_steps(name, steps=6, lr=0.5):
    """`steps` SGD steps of the 4-stage pipeline on one batch; returns this stage's max
    |param - one process's|, and the losses (last stage)."""
    m = 4
    batches = synthetic_task(CFG, batch_size=BATCH, steps=1, seed=5) * steps
    model = gpt(CFG, seed=2)
    stage = PipelineStage(model, m, batches[0][0].shape)
    opt = torch.optim.SGD(stage.module.parameters(), lr=lr, momentum=0.9)
    ref = gpt(CFG, seed=2)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=lr, momentum=0.9)
    losses = []
    for idx, targets in batches:
        opt.zero_grad()
        res = run_schedule(stage, get_schedule(name, 4, m), idx, targets, lm_loss)
        opt.step()
        losses.append(res.loss)
        ref_opt.zero_grad()
        loss, grads = reference_grads(ref, idx, targets, lm_loss, m)
        for q, g in zip(ref.parameters(), grads):
            q.grad = g
        ref_opt.step()
    theirs = list(ref[stage.start:stage.end].parameters())
    return max((a - b).abs().max().item() for a, b in zip(stage.module.parameters(), theirs)), losses


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_training_matches_single_process_and_loss_falls(world, name):
    results = world(4).run(train_steps, name)
    assert all(err < 1e-5 for err, _ in results), [err for err, _ in results]
    losses = results[-1][1]
    assert losses[-1] < losses[0]


def measure(p=4, m=8):
    """Peak activation bytes of this stage under each schedule, and a one-micro-batch run's."""
    idx, targets = synthetic_task(CFG, batch_size=BATCH, steps=1)[0]
    out = {}
    for name, mm in (("gpipe", m), ("1f1b", m), ("one", 1)):
        b = BATCH // m * mm                   # "one": a single micro-batch of the same size
        stage = PipelineStage(gpt(CFG, seed=0), mm, (b,) + tuple(idx.shape[1:]))
        res = run_schedule(stage, get_schedule("gpipe" if name == "one" else name, p, mm), idx[:b], targets[:b],
                           lm_loss, measure_memory=True)
        out[name] = (res.peak_activation_bytes, res.live_bytes[-1])
    return out


def test_peak_activations_gpipe_m_microbatches_1f1b_p_minus_rank(world):
    p, m = 4, 8
    for rank, out in enumerate(world(4).run(measure, p, m)):
        one = out["one"][0]                   # one micro-batch's activations on this stage
        assert one > 0
        assert out["gpipe"][0] == m * one, (rank, out)
        assert out["1f1b"][0] == (p - rank) * one, (rank, out)
        assert all(live == 0 for _, live in out.values())   # all freed by the backwards


def traced(name, p=4, m=4):
    from ddnb.trace import Tracer

    tracer = Tracer()
    idx, targets = synthetic_task(CFG, batch_size=BATCH, steps=1)[0]
    stage = PipelineStage(gpt(CFG, seed=0), m, idx.shape, tracer=tracer)
    run_schedule(stage, get_schedule(name, p, m), idx, targets, lm_loss)
    return tracer.take()


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_every_f_and_b_is_traced(world, name):
    per_rank = world(4).run(traced, name)
    schedule = get_schedule(name, 4, 4)
    for r, events in enumerate(per_rank):
        compute = [e for e in events if e["kind"] == "compute"]
        assert [Action(e["op"], e["microbatch"]) for e in compute] == schedule[r]
        sends = [e for e in events if e["kind"] == "send"]
        recvs = [e for e in events if e["kind"] == "recv"]
        assert len(sends) == (4 if r in (0, 3) else 8) == len(recvs)     # m activations and/or m grads
        assert all(e["nbytes"] == 2 * CFG.seq_len * CFG.d_model * 4 for e in sends)  # (2, T, d) float32
    assert 0.0 < bubble_fraction([e for evs in per_rank for e in evs]) < 1.0


def bad_input():
    """Every rank tries the bad configurations; returns the errors and whether anything
    was traced (a message would have been), then runs a good step to show nothing hangs."""
    from ddnb.trace import Tracer

    tracer = Tracer()
    errors = []
    idx, targets = synthetic_task(CFG, batch_size=BATCH, steps=1)[0]
    for make in (lambda: PipelineStage(gpt(CFG), 3, idx.shape, tracer=tracer),                   # 3 does not divide 8
                 lambda: PipelineStage(gpt(GPTConfig(n_layers=1)), 2, idx.shape, tracer=tracer),  # 3 layers, 4 stages
                 lambda: run_schedule(PipelineStage(gpt(CFG), 2, idx.shape, tracer=tracer),
                                      gpipe_schedule(3, 2), idx, targets, lm_loss),              # 3-rank schedule
                 lambda: run_schedule(PipelineStage(gpt(CFG), 2, idx.shape, tracer=tracer),
                                      one_f_one_b_schedule(4, 3), idx, targets, lm_loss)):       # m=3 schedule for m=2
        try:
            make()
            errors.append(None)
        except ValueError as e:
            errors.append(str(e))
    quiet = not tracer.take()
    res = run_schedule(PipelineStage(gpt(CFG), 2, idx.shape), one_f_one_b_schedule(4, 2), idx, targets, lm_loss)
    return errors, quiet, res.loss


def test_bad_input_raises_on_every_rank_before_any_message(world):
    for errors, quiet, loss in world(4).run(bad_input):
        assert quiet
        assert "microbatches(3) does not divide batch_size(8): 8 % 3 = 2" in errors[0]
        assert "more stages than layers: stages(4) > layers(3)" in errors[1]
        assert "3 ranks" in errors[2] and "world_size(4)" in errors[2]
        assert errors[3] is not None and "micro-batches 0..1" in errors[3]
    assert loss is not None                         # the world still works


# ---------------------------------------------------------------- pictures, no cluster
def test_plots_and_widget_draw_from_plain_data():
    import ipywidgets

    from ddnb.viz import PipelineExplorer, plot_activation_peaks, plot_bubble, plot_pipeline, plot_schedule

    ax = plot_pipeline(simulate(one_f_one_b_schedule(4, 8)), unit=None)
    assert len(ax.patches) == 2 * 4 * 8 and len(ax.texts) == 2 * 4 * 8
    ax = plot_schedule(gpipe_schedule(3, 4))
    assert "bubble 0.333" in ax.get_title()
    ax = plot_schedule(interleaved_one_f_one_b_schedule(2, 4, 2))      # (p-1)/(vm+p-1) = 1/9
    assert "bubble 0.111" in ax.get_title() and len(ax.patches) == 2 * 2 * 4 * 2
    assert len(ax.get_legend().get_texts()) == 4                       # F and B, per chunk
    ax = plot_bubble(4, {"GPipe": {1: 0.8, 4: 0.45}, "1F1B": {4: 0.44}})
    assert len(ax.lines) == 3
    ax = plot_activation_peaks({"GPipe": [8, 8, 8, 8], "1F1B": [4, 3, 2, 1]}, unit="B")
    assert [b.get_height() for b in ax.patches] == [8, 8, 8, 8, 4, 3, 2, 1]
    ex = PipelineExplorer(stages=2, microbatches=2)
    assert isinstance(ex.image, ipywidgets.Image) and ex.image.value[:4] == b"\x89PNG"
    before = ex.image.value
    ex.m.value = 6
    assert ex.image.value != before and "m=6" in ex.status.value
    ex.m.value, ex.v.value = 3, 1
    assert "interleaved needs m % p == 0 (3 % 2 = 1)" in ex.status.value
