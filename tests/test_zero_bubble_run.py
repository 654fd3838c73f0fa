"""The executor runs every checked schedule, the zero-bubble ones with the backward split
into B (input gradient) and W (weight gradients) (Qi et al. 2024, "Zero Bubble Pipeline
Parallelism", Sec. 2): B + W do the FLOPs of one full backward (the naive split does
nearly two) and give its gradients; one step of ZB-H1, ZB-V and DualPipeV (and GPipe,
interleaved 1F1B) gives the gradients (1e-5) of one process on the whole batch and of the
1F1B run, for p = 4 (m = 8) and p = 2 (m = 4, a subgroup of the last two ranks), and ZB-V and
DualPipeV those of torch's ScheduleZBVZeroBubble and ScheduleDualPipeV on the same V; the
micro-batches each rank holds, measured (F until W), are the checker's peak_in_flight;
every F, B and W is traced with its op and virtual stage; on the V the two stages at its
turn hand over in memory (no message) and the last stage, on rank 0, has the loss; a V
schedule on looped stages is refused before any message; on an emulated cluster ZB-H1's
measured bubble is well under 1F1B's (p = 4, m = 8).

The distributed checks are one World.run on the session's 4-rank world (`world` in
conftest), its results shared by the tests of this module.
"""
import pytest
import torch
import torch.distributed as dist
from torch.utils.flop_counter import FlopCounterMode

from ddnb.models import GPTConfig, gpt, lm_loss, synthetic_task
from ddnb.pipeline_parallel import (Action, PipelineStage, build_stages, get_schedule, reference_grads, run_schedule,
                                    torch_pipeline_grads, validate_schedule, zbv_schedule)
from ddnb.pipeline_parallel.split_backward import (backward_input, backward_input_naive, backward_weight,
                                                   backward_weight_naive)

CFG = GPTConfig(n_layers=6)        # Embedding, 6 Blocks, Head: 8 layers, 2 virtual stages per rank for p = 4
BATCH = 16
NAMES = ("1f1b", "gpipe", "interleaved", "zbh1", "zbv", "dualpipev")
CASES = ((4, 8), (2, 4))           # (p, m)


# ---------------------------------------------------------------- B and W, one process
def _backward(stage, x0, target, how):
    """(dx, weight grads, FLOPs of B, FLOPs of W) of one backward of `stage` on x0:
    "full" (B = everything), "split" or "naive"."""
    stage.zero_grad(set_to_none=True)
    x = x0.clone().requires_grad_()
    out = stage(x)
    root, grad = (lm_loss(out, target), None) if target is not None else (out, torch.ones_like(out))
    with FlopCounterMode(display=False) as b:
        if how == "full":
            torch.autograd.backward(root, grad)
            dx, saved = x.grad, None
        elif how == "split":
            dx, saved = backward_input(root, grad, x, stage.parameters())
        else:
            dx, saved = backward_input_naive(root, grad, x)
    with FlopCounterMode(display=False) as w:
        if how == "split":
            backward_weight(saved, stage.parameters())
        elif how == "naive":
            backward_weight_naive(saved, stage.parameters())
    return dx, [q.grad.clone() for q in stage.parameters()], b.get_total_flops(), w.get_total_flops()


@pytest.mark.parametrize("layers, with_loss", [((1, 3), False), ((6, 8), True)])   # two blocks; block + head
def test_split_backward_has_one_backwards_grads_and_flops(layers, with_loss):
    model = gpt(CFG, seed=0)
    stage = model[layers[0]:layers[1]]
    x0 = torch.randn(2, CFG.seq_len, CFG.d_model, generator=torch.Generator().manual_seed(0))
    target = synthetic_task(CFG, batch_size=2, steps=1)[0][1] if with_loss else None
    dx, grads, full, _ = _backward(stage, x0, target, "full")
    for how in ("split", "naive"):
        dx2, grads2, b, w = _backward(stage, x0, target, how)
        assert torch.allclose(dx, dx2, atol=1e-6, rtol=0)
        assert all(torch.allclose(g, g2, atol=1e-6, rtol=0) for g, g2 in zip(grads, grads2)), how
        assert 0 < b < full
        if how == "split":
            assert b + w == full                  # W runs the weight products alone
        else:
            assert w >= 0.9 * full                # W rebuilds dy from the output: nearly a second backward


def test_backward_flops_on_a_linear_stack_f_b_w_alike():
    from torch import nn

    from ddnb.pipeline_parallel.split_backward import backward_flops

    stage = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
    f = backward_flops(stage, torch.randn(4, 32))
    assert f["F"] == f["B"] == f["W"] == 2 * 2 * 4 * 32 * 32 and f["B"] + f["W"] == f["full"]
    assert f["naive B"] == f["B"] and f["naive W"] == 3 * f["W"] // 2       # dy rebuilt through layer 2
    assert all(q.grad is None for q in stage.parameters())


# ---------------------------------------------------------------- every schedule on a real pipeline
def _group(p):
    """A group of the last p ranks of the world (WORLD for p = world size); None off it."""
    n, rank = dist.get_world_size(), dist.get_rank()
    group = dist.group.WORLD if p == n else dist.new_group(list(range(n - p, n)))
    return group if rank >= n - p else None


def every_schedule(cases=CASES, names=NAMES):
    """For each (p, m) on the last p ranks and each schedule: this rank's max |grad - one
    process| and max |grad - the 1F1B run's| over the whole model (gathered), its loss and
    the reference's, measured and checked peaks in flight, the traced compute (action,
    virtual stage), messages sent, activation bytes left at the end."""
    from ddnb.trace import Tracer

    out = {}
    idx, targets = synthetic_task(CFG, batch_size=BATCH, steps=1, seed=6)[0]
    names_of = [n for n, _ in gpt(CFG).named_parameters()]
    for p, m in cases:
        group = _group(p)
        if group is None:
            continue
        rank = dist.get_rank(group)
        ref_loss, ref = reference_grads(gpt(CFG, seed=1), idx, targets, lm_loss, m)
        ref = dict(zip(names_of, ref))
        full = {}
        for name in NAMES:
            schedule, tracer, model = get_schedule(name, p, m), Tracer(), gpt(CFG, seed=1)
            stages = build_stages(model, schedule, m, idx.shape, group=group, tracer=tracer)
            res = run_schedule(stages, schedule, idx, targets, lm_loss, measure_memory=True)
            param_name = {id(q): n for n, q in model.named_parameters()}
            mine = {param_name[id(q)]: q.grad.detach().clone() for st in stages for q in st.module.parameters()}
            every = [None] * p
            dist.all_gather_object(every, mine, group=group)
            full[name] = {k: g for d in every for k, g in d.items()}
            events = tracer.take()
            torch_err = None
            if name in ("zbv", "dualpipev"):      # torch's own schedules, on the same V placement
                tloss, tgrads = torch_pipeline_grads(gpt(CFG, seed=1), name, idx if 0 in schedule.placement[rank]
                                                     else None, targets if 0 in schedule.placement[rank] else None,
                                                     lm_loss, m, group=group)
                mine_list = [q.grad for st in stages for q in st.module.parameters()]
                torch_err = max((a - b).abs().max().item() for a, b in zip(mine_list, tgrads))
            out[p, m, name] = {
                "rank": rank, "schedule": schedule[rank], "placement": schedule.placement[rank],
                "ref_err": max((g - ref[k]).abs().max().item() for k, g in full[name].items()),
                "complete": sorted(full[name]) == sorted(names_of),
                "loss": res.loss, "ref_loss": ref_loss, "in_flight": res.in_flight,
                "checked": validate_schedule(schedule, m).peak_in_flight[rank],
                "compute": [(Action(e["op"], e["microbatch"], e["chunk"]), e["stage"])
                            for e in events if e["kind"] == "compute"],
                "sends": sum(e["kind"] == "send" for e in events), "recvs": sum(e["kind"] == "recv" for e in events),
                "live_end": res.live_bytes[-1], "peak_bytes": res.peak_activation_bytes, "torch_err": torch_err}
        for name in NAMES:
            out[p, m, name]["vs_1f1b"] = max((g - full["1f1b"][k]).abs().max().item() for k, g in full[name].items())
    return out


@pytest.fixture(scope="module")
def runs(world):
    """Every rank's results of `every_schedule`, one World.run for the module."""
    return world(4).run(every_schedule)


def _results(runs, p, m, name):
    return sorted((r[p, m, name] for r in runs if (p, m, name) in r), key=lambda x: x["rank"])


@pytest.mark.parametrize("p, m", CASES)
@pytest.mark.parametrize("name", NAMES)
def test_gradients_equal_one_process_and_1f1b(runs, name, p, m):
    results = _results(runs, p, m, name)
    assert [x["rank"] for x in results] == list(range(p))
    for x in results:
        assert x["complete"]
        assert x["ref_err"] < 1e-5 and x["vs_1f1b"] < 1e-5, (name, x["rank"], x["ref_err"], x["vs_1f1b"])
        if name in ("zbv", "dualpipev"):         # torch's ScheduleZBVZeroBubble / ScheduleDualPipeV
            assert x["torch_err"] < 1e-5, (name, x["rank"], x["torch_err"])
    has_loss = [x["rank"] for x in results if x["loss"] is not None]
    assert has_loss == ([0] if name in ("zbv", "dualpipev") else [p - 1])     # the V ends on rank 0
    loss = results[has_loss[0]]
    assert loss["loss"] == pytest.approx(loss["ref_loss"], abs=1e-6)


@pytest.mark.parametrize("p, m", CASES)
@pytest.mark.parametrize("name", NAMES)
def test_measured_in_flight_is_the_checkers(runs, name, p, m):
    for x in _results(runs, p, m, name):
        assert x["in_flight"] == x["checked"], (name, x["rank"])
        assert x["live_end"] == 0 and x["peak_bytes"] > 0           # W (or B) freed everything


@pytest.mark.parametrize("p, m", CASES)
@pytest.mark.parametrize("name", NAMES)
def test_every_action_is_traced_with_its_op_and_stage(runs, name, p, m):
    for x in _results(runs, p, m, name):
        assert [a for a, _ in x["compute"]] == x["schedule"]
        assert all(stage == x["placement"][a.chunk] for a, stage in x["compute"])
        assert any(a.op == "W" for a, _ in x["compute"]) == (name in ("zbh1", "zbv", "dualpipev"))


@pytest.mark.parametrize("p, m", CASES)
@pytest.mark.parametrize("name", ["zbv", "dualpipev"])
def test_the_vs_turn_hands_over_in_memory(runs, name, p, m):
    """Rank r holds stages r and 2p-1-r: each chunk sends m activations and m gradients,
    except where a neighbour is missing (rank 0: the model's ends) or on the same rank
    (rank p-1, the turn): 2m messages each way there, 4m in between."""
    for x in _results(runs, p, m, name):
        r = x["rank"]
        assert x["placement"] == [r, 2 * p - 1 - r]
        assert x["sends"] == x["recvs"] == (2 * m if r in (0, p - 1) else 4 * m), (name, r)


def v_on_looped_stages():
    """A V schedule run on stages built for the looped placement, then a bad placement:
    both refused (on every rank) before anything is traced."""
    from ddnb.trace import Tracer

    tracer, errors = Tracer(), []
    idx, targets = synthetic_task(CFG, batch_size=BATCH, steps=1)[0]
    model = gpt(CFG)
    for make in (lambda: run_schedule([PipelineStage(model, 4, idx.shape, tracer=tracer, chunk=c, chunks=2)
                                       for c in range(2)], zbv_schedule(4, 4), idx, targets, lm_loss),
                 lambda: PipelineStage(model, 4, idx.shape, tracer=tracer, placement=[[0, 1], [2, 3], [4, 5], [6, 6]])):
        try:
            make()
            errors.append(None)
        except ValueError as e:
            errors.append(str(e))
    return errors, not tracer.take()


def test_a_v_schedule_on_looped_stages_is_refused_before_any_message(world):
    for errors, quiet in world(4).run(v_on_looped_stages):
        assert quiet
        assert "build_stages" in errors[0] and "[0, 7]" in errors[0]
        assert errors[1] is not None and "distinct virtual stages" in errors[1]


# ---------------------------------------------------------------- the bubble, emulated
def emulated_bubble(name, m=8, width=1024, microbatch_size=64):
    """The measured bubble (`bubble_fraction` of every rank's compute events) of one step
    of `name` on equal stages of two Linear(width, width) + ReLU, clocks aligned by a
    barrier first."""
    import torch.nn.functional as F
    from torch import nn

    from ddnb.collectives import traced
    from ddnb.emulate import uncounted
    from ddnb.pipeline_parallel import bubble_fraction
    from ddnb.trace import Tracer

    p = dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(2 * p)])
    tracer, schedule, batch = Tracer(), get_schedule(name, p, m), microbatch_size * m
    stages = build_stages(model, schedule, m, (batch, width), input_dtype=torch.float32, tracer=tracer)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(batch, width, generator=g), torch.randn(batch, width, generator=g)
    traced.barrier()                         # the ranks built their stages in different times
    run_schedule(stages, schedule, x, y, F.mse_loss)
    every = [None] * p
    with uncounted():                        # gathering the results is not part of the step
        dist.all_gather_object(every, [dict(e, rank=dist.get_rank()) for e in tracer.take()
                                       if e["kind"] == "compute"])
    return bubble_fraction([e for evs in every for e in evs])


def test_zbh1_measured_bubble_is_well_under_1f1bs_on_an_emulated_cluster():
    """p = 4, m = 8 on A100s joined by NVLink ("ib"): 1F1B 0.323 measured ((p-1)/(m+p-1) =
    0.273 on paper), ZB-H1 0.157 ((p-1)/(3m+p-1) = 0.111 on paper with T_F = T_B = T_W:
    here the messages and W's gradient accumulation cost too); the same at slowdown 100
    and 1000 (ZB-V 0.134, DualPipeV 0.107, GPipe 0.308, interleaved 0.222)."""
    from ddnb.emulate import get_profile
    from ddnb.testing import World

    with World(4, emulate=get_profile("ib").with_(slowdown=100), timeout=120) as w:
        bubble = {name: w.run(emulated_bubble, name)[0] for name in ("1f1b", "zbh1")}
    assert bubble["zbh1"] < bubble["1f1b"] - 0.1, bubble
