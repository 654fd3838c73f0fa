"""DiLoCo and streaming DiLoCo (ddnb.decentralized.diloco) against their single-process
reference, torch's Nesterov SGD, and DDP: bytes counted from the emulated ring's messages,
final losses, the stagger and the peak bytes per synchronization; and the outer-step checker."""
import pytest
import torch

from ddnb.decentralized.diloco import (DiLoCoConfig, fragment_bounds, outer_step, simulate_diloco, sync_schedule)


def test_validate_lists_every_bad_field():
    bad = DiLoCoConfig(steps=45, inner_steps=10, outer_lr=-1.0, outer_momentum=1.0, fragments=20, mix=1.5,
                       batch_size=0)
    with pytest.raises(ValueError) as e:
        bad.validate(4)
    msg = str(e.value)
    for field in ("steps=45", "batch_size=0", "fragments=20", "outer_lr=-1.0", "outer_momentum=1.0", "mix=1.5"):
        assert field in msg, (field, msg)
    with pytest.raises(ValueError, match="overlap=5"):
        DiLoCoConfig(inner_steps=8, fragments=4, overlap=5).validate(2)
    assert DiLoCoConfig().validate(4) == DiLoCoConfig()


def test_outer_step_is_torch_sgd_nesterov():
    g = torch.Generator().manual_seed(0)
    theta = [torch.randn(7, generator=g), torch.randn(3, 4, generator=g)]
    params = [torch.nn.Parameter(t.clone()) for t in theta]
    opt = torch.optim.SGD(params, lr=0.7, momentum=0.9, nesterov=True)
    bufs = [torch.zeros_like(t) for t in theta]
    for _ in range(4):
        avg = [t + 0.1 * torch.randn(t.shape, generator=g) for t in theta]     # the workers' average
        for p, a in zip(params, avg):
            p.grad = p.detach() - a
        opt.step()
        outer_step(avg, theta, bufs, lr=0.7, momentum=0.9, nesterov=True)
        for p, t, b in zip(params, theta, bufs):
            torch.testing.assert_close(t, p.detach(), rtol=0, atol=1e-6)
            torch.testing.assert_close(b, opt.state[p]["momentum_buffer"], rtol=0, atol=1e-6)


def test_sync_schedule_staggers_and_covers():
    steps, H, F = 48, 8, 4
    sched = sync_schedule(steps, H, F)
    per_step = {}
    for t, f in sched:
        per_step.setdefault(t, []).append(f)
    assert all(len(fs) == 1 for fs in per_step.values())                  # staggered: one fragment per step
    for f in range(F):
        ts = [t for t, p in sched if p == f]
        assert ts[0] == f * H // F or (f == 0 and ts[0] == H)
        assert all(b - a == H for a, b in zip(ts, ts[1:])) and len(ts) >= steps // H
    assert sync_schedule(steps, H, 1) == [(t, 0) for t in range(H, steps + 1, H)]   # DiLoCo
    bounds = fragment_bounds(20672, F)
    assert bounds[0][0] == 0 and bounds[-1][1] == 20672 and all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))


@pytest.fixture(scope="module")
def world():
    from ddnb.emulate import custom
    from ddnb.testing import World

    profile = custom(alpha=10e-6, bandwidth=0.1e9, slowdown=1.0, name="0.1 GB/s")
    with World(4, timeout=300, emulate=profile) as w:
        yield w


def _run(method, config):
    from ddnb.decentralized.diloco import RUNS

    return RUNS[method](config)


@pytest.mark.parametrize("method,config", [
    ("diloco", DiLoCoConfig(steps=20, inner_steps=10)),
    ("streaming_diloco", DiLoCoConfig(steps=20, inner_steps=10, fragments=2, overlap=1)),
])
def test_processes_match_the_single_process_simulation(world, method, config):
    ranks = world.run(_run, method, config)
    ref = simulate_diloco(method, config, 4)
    for r in ranks:
        torch.testing.assert_close(r["params"], ref["params"], rtol=0, atol=1e-5)
    losses = [sum(r["losses"][t] for r in ranks) / 4 for t in range(config.steps)]
    assert losses == pytest.approx(ref["losses"], abs=1e-5)


def test_diloco_sends_50x_fewer_bytes_and_streaming_cuts_the_peak(world):
    config = DiLoCoConfig(steps=100, inner_steps=50, fragments=4)
    ddp, diloco, streaming = (world.run(_run, m, config) for m in ("ddp", "diloco", "streaming_diloco"))
    assert ddp[0]["bytes_from"] == "emulated ring messages"                # counted from messages, not a formula
    ratio = min(d["bytes_sent"] for d in ddp) / max(d["bytes_sent"] for d in diloco)
    assert ratio >= 40, ratio
    full = max(d["peak_bytes_per_sync"] for d in diloco)                   # one full synchronization
    assert max(s["peak_bytes_per_sync"] for s in streaming) * config.fragments <= full


def test_diloco_reaches_ddp_final_loss_on_the_chapter_task():
    # The chapter's budget (DiLoCoConfig(): 500 steps, H = 50) in the one-process reference,
    # which the processes match to 1e-5 (test above).
    ddp, diloco = (simulate_diloco(m, DiLoCoConfig(), 4)["final_loss"] for m in ("ddp", "diloco"))
    assert diloco <= 1.05 * ddp, (diloco, ddp)


def test_check_outer_step_accepts_rejects_and_refuses_the_shortcut():
    from ddnb.exercises import check_outer_step
    from ddnb.exercises.solutions.diloco import outer_step as solution

    assert check_outer_step(solution).startswith("✓")

    def plain_sgd(local, theta, bufs, lr, momentum):       # no momentum: wrong
        import torch.distributed as dist
        out = []
        for x, t in zip(local, theta):
            d = t - x
            dist.all_reduce(d)
            out.append(t - lr * d / dist.get_world_size())
        return out

    with pytest.raises(AssertionError, match="outer step 1"):
        check_outer_step(plain_sgd)

    def shortcut(local, theta, bufs, lr, momentum):
        import torch.distributed as dist
        from ddnb.decentralized import diloco
        avg = [x.clone() for x in local]
        for a in avg:
            dist.all_reduce(a)
            a /= dist.get_world_size()
        return diloco.outer_step(avg, theta, bufs, lr, momentum)

    with pytest.raises(AssertionError, match="outer_step"):
        check_outer_step(shortcut)                          # named in the code

    def hidden(local, theta, bufs, lr, momentum):
        import importlib
        step = getattr(importlib.import_module("ddnb.decentralized.diloco"), "outer_" + "step")
        return step(local, theta, bufs, lr, momentum)

    with pytest.raises(AssertionError, match="off in this exercise"):
        check_outer_step(hidden)                            # refused on the ranks
