"""Lost workers on a real ddnb.Cluster: an engine's process is killed (SIGKILL, no clean-up)
in the middle of a from-scratch ring all-reduce, of a data-parallel training step (during
its backward, while the others all-reduce) and of a pipeline step (in a middle stage's
forward of a micro-batch). Each time `Cluster.run` raises WorkerLostError naming rank 1
and its pid within the cluster's timeout, never hangs; `restart()` gives a working world in
the same process; and when the cluster stops no engine is left.

The victim kills itself at a set point inside the operation (a tracer that fires on the
ring's third message, a gradient hook, a forward hook), so "during" is by construction,
not by timing.
"""
import os
import signal
import time

import pytest

from ddnb.cluster import Cluster
from ddnb.errors import WorkerLostError
from test_cluster import gone, rank_info

VICTIM = 1
TIMEOUT = 30


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def ring_allreduces():
    """Ring all-reduces of 1 MB in a loop; rank 1 dies on its third message of the fourth."""
    import torch
    import torch.distributed as dist

    from ddnb.collectives import ring_allreduce
    from ddnb.trace import Tracer

    class DieOnMessage(Tracer):
        def __init__(self, at):
            super().__init__()
            self.left = at

        def record(self, kind, *args, **kwargs):
            if kind in ("send", "recv"):
                self.left -= 1
                if self.left == 0:
                    die()
            super().record(kind, *args, **kwargs)

    tracer = DieOnMessage(at=3) if dist.get_rank() == VICTIM else None
    x = torch.ones(1 << 18)
    for call in range(100):
        ring_allreduce(x, tracer=tracer if call == 3 else None)
    return x[0].item()


def dp_steps():
    """DDP on the digits MLP; rank 1 dies in the backward of step 5, after its first gradient."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from ddnb.data import digits
    from ddnb.models import mlp

    (x, y), _ = digits()
    model = torch.nn.parallel.DistributedDataParallel(mlp((64, 128, 10), seed=0))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    step = {"n": 0}
    if dist.get_rank() == VICTIM:
        first = list(model.parameters())[0]            # its gradient comes last in the backward
        first.register_hook(lambda g: die() if step["n"] == 5 else g)
    for step["n"] in range(200):
        opt.zero_grad()
        F.cross_entropy(model(x[:32]), y[:32]).backward()
        opt.step()
    return step["n"]


def pipeline_steps():
    """A 3-stage 1F1B pipeline of a small GPT; stage 1 dies in the forward of micro-batch 2
    of step 3, while stage 0 is sending it more and stage 2 waits for its activations."""
    import torch
    import torch.distributed as dist

    from ddnb.models import GPTConfig, gpt, lm_loss, synthetic_task
    from ddnb.pipeline_parallel import PipelineStage, get_schedule, run_schedule

    cfg, m = GPTConfig(n_layers=2), 4
    (idx, targets), = synthetic_task(cfg, batch_size=8, steps=1, seed=5)
    stage = PipelineStage(gpt(cfg, seed=2), m, idx.shape)
    calls = {"n": 0}
    if dist.get_rank() == VICTIM:
        def count(module, inputs, output):
            calls["n"] += 1
            if calls["n"] == 3 * m + 2:
                die()
        stage.module.register_forward_hook(count)
    opt = torch.optim.SGD(stage.module.parameters(), lr=0.1)
    for _ in range(100):
        opt.zero_grad()
        run_schedule(stage, get_schedule("1f1b", dist.get_world_size(), m), idx, targets, lm_loss)
        opt.step()
    return calls["n"]


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(n=3, timeout=TIMEOUT)
    pids = list(c.pids())
    yield c, pids
    pids += c.pids()
    c.stop()
    assert gone(pids), f"engines left running: {[p for p in pids if os.path.exists(f'/proc/{p}')]}"


@pytest.mark.parametrize("operation", [ring_allreduces, dp_steps, pipeline_steps],
                         ids=["ring-allreduce", "dp-step", "pipeline-step"])
def test_a_worker_killed_mid_operation_is_named_and_the_cluster_restarts(cluster, operation):
    c, pids = cluster
    if not c.alive():
        c.restart()
    pids += c.pids()
    victim = c.workers[VICTIM]["pid"]
    t0 = time.monotonic()
    with pytest.raises(WorkerLostError, match=rf"rank {VICTIM} \(engine \d+, pid {victim}") as e:
        c.run(operation)
    assert e.value.ranks == [VICTIM]
    assert time.monotonic() - t0 < TIMEOUT + 10          # found within the timeout, not a hang
    assert gone([victim], within=5)
    with pytest.raises(WorkerLostError, match=rf"rank\(s\) {VICTIM} of this cluster died earlier"):
        c.run(rank_info)
    c.restart()                                          # the same kernel, a fresh world
    assert [g[:2] for g in c.run(rank_info)] == [(0, 3), (1, 3), (2, 3)]
