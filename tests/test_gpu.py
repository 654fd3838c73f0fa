"""The core paths on CUDA (marker `gpu`), skipped on a machine without a GPU:

- every from-scratch all-reduce on CUDA tensors, against torch.distributed on the same
  inputs: over gloo (one GPU is enough: the messages travel through the host), and over
  nccl with one GPU per rank where there are at least two;
- data parallelism on CUDA (ddnb's naive and bucketed wrappers, torch DDP) reaching the
  same parameters as one process on the CPU;
- the timing helper on an nccl world (it synchronizes the device);
- the bucketed path's async torch all-reduce and its find_unused_parameters bitmap on
  CUDA; backend="auto" with one rank per GPU ("cpu:gloo,cuda:nccl": CPU and CUDA tensors
  both reduce); the parameter server on pure nccl (named receives, messages on the GPU).

`scripts/gpu_check.sh` runs them (and prints what the machine has) in a few minutes;
tests/test_gpu_modules.py covers the other parallelisms the same way.

Where the tensors go comes from one place, `rank_device()`: this rank's GPU, or, with
DDNB_GPU_TESTS_DEVICE=cpu, the CPU, so that a machine without a GPU can check the tests'
own logic (`DDNB_GPU_TESTS_DEVICE=cpu pytest tests/test_gpu.py tests/test_gpu_modules.py
-m gpu`; the nccl tests stay skipped). A test that needs nccl with one GPU per rank is
marked `needs_two`, skipped with a reason that says "needs 2 GPUs".
"""
import os

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ddnb.collectives import ALLREDUCES, OPS
from ddnb.testing import World
from test_collectives import TORCH_OP, compare, error_bound, make_input
from test_data_parallel import LR, MOMENTUM, global_batches, make_model, reference_params, shard

DEVICE = os.environ.get("DDNB_GPU_TESTS_DEVICE", "cuda")
if DEVICE not in ("cuda", "cpu"):
    raise ValueError(f"DDNB_GPU_TESTS_DEVICE={DEVICE!r}: need 'cuda' (the default) or 'cpu'")
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
no_gpu = pytest.mark.skipif(DEVICE == "cuda" and GPUS == 0, reason=(
    "needs a CUDA device (none here; DDNB_GPU_TESTS_DEVICE=cpu runs these tests on the CPU)"))
pytestmark = [pytest.mark.gpu, no_gpu]
needs_two = pytest.mark.skipif(DEVICE != "cuda" or GPUS < 2, reason=(
    f"needs 2 GPUs (nccl: one GPU per rank), {GPUS} here" if DEVICE == "cuda" else
    f"needs 2 GPUs (nccl: one GPU per rank); DDNB_GPU_TESTS_DEVICE={DEVICE}"))


def rank_device() -> torch.device:
    """On a rank: where its tensors go in these tests: its GPU (rank r % GPUs, as
    `ddnb.testing.World` sets it, whatever the backend), or DDNB_GPU_TESTS_DEVICE's CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if DEVICE == "cuda" else torch.device(DEVICE)


def cuda_sweep():
    """On every rank: each algorithm x dtype x op x size on a CUDA tensor, compared with
    dist.all_reduce (on the CPU under gloo, on the GPU under nccl). Returns mismatches."""
    rank, n = dist.get_rank(), dist.get_world_size()
    device = rank_device()
    nccl, bad, seed = dist.get_backend() == "nccl", [], 0
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int64):
        for op in OPS:
            if op == "avg" and not dtype.is_floating_point:
                continue
            for numel in (0, 1, n + 1, 100_003):
                seed += 1
                inputs = [make_input(r, seed, (numel,), dtype, op) for r in range(n)]
                ref = inputs[rank].clone().to(device if nccl else "cpu")
                dist.all_reduce(ref, op=TORCH_OP[op])
                ref = ref.cpu()
                bound = error_bound(inputs, ref, op) if dtype.is_floating_point else None
                for algo, fn in ALLREDUCES.items():
                    x = inputs[rank].to(device, copy=True)
                    out = fn(x, op=op)
                    why = ("did not return its input" if out is not x else
                           f"left {x.device}" if x.device != device else compare(x.cpu(), ref, bound))
                    if why:
                        bad.append(f"rank {rank} {dist.get_backend()} {algo} {dtype} {op} numel={numel}: {why}")
    return bad


def test_allreduces_on_cuda_tensors_over_gloo():
    with World(2, timeout=120) as world:
        bad = [b for r in world.run(cuda_sweep) for b in r]
    assert not bad, f"{len(bad)} mismatches, first: " + "\n".join(bad[:10])


@needs_two
def test_allreduces_over_nccl_one_gpu_per_rank():
    with World(min(GPUS, 4), timeout=120, backend="nccl") as world:
        bad = [b for r in world.run(cuda_sweep) for b in r]
    assert not bad, f"{len(bad)} mismatches, first: " + "\n".join(bad[:10])


def train_on_cuda(strategy, allreduce):
    """10 SGD steps on CUDA; returns max |param - the CPU single-process reference|."""
    from ddnb.data_parallel import BucketedDataParallel, NaiveDataParallel

    rank, n = dist.get_rank(), dist.get_world_size()
    device = rank_device()
    model = make_model(seed=rank).to(device)
    sync = lambda: None   # noqa: E731
    if strategy == "naive":
        model = NaiveDataParallel(model, allreduce=allreduce)
        sync = model.sync_gradients
    elif strategy == "bucketed":
        model = BucketedDataParallel(model, bucket_mb=0.001, first_bucket_mb=None, allreduce=allreduce)
    else:
        ids = [device.index] if device.type == "cuda" else None
        model = nn.parallel.DistributedDataParallel(model, device_ids=ids)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for x, y in global_batches(n):
        opt.zero_grad()
        F.mse_loss(model(shard(x, rank).to(device)), shard(y, rank).to(device)).backward()
        sync()
        opt.step()
    ref = reference_params(n)
    return max((p.detach().cpu() - r).abs().max().item() for p, r in zip(model.parameters(), ref))


@pytest.mark.parametrize("backend", ["gloo", pytest.param("nccl", marks=needs_two)])
def test_data_parallel_on_cuda_matches_one_cpu_process(backend):
    with World(2, timeout=120, backend=backend) as world:
        for strategy, allreduce in [("naive", "ring"), ("naive", "torch"), ("bucketed", "ring"),
                                    ("bucketed", "torch"), ("ddp", None)]:
            errors = world.run(train_on_cuda, strategy, allreduce)
            assert max(errors) < 1e-4, (backend, strategy, allreduce, errors)


def timed_nccl():
    from ddnb.timing import time_collective

    return time_collective(dist.all_reduce, 1 << 20, iters=5)


@needs_two
def test_time_collective_on_nccl():
    with World(2, timeout=120, backend="nccl") as world:
        times = world.run(timed_nccl)
    assert len(set(times)) == 1 and 0 < times[0] < 1.0   # the slowest rank's time, on every rank


def unused_on_cuda(allreduce):
    """Two branches; only the first is used: its gradient is the mean over ranks, the
    unused branch keeps .grad = None, and the bitmap lived on the GPU (no error on nccl)."""
    from ddnb.data_parallel import BucketedDataParallel

    class TwoBranches(nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.unused = nn.Linear(4, 3), nn.Linear(4, 3)

        def forward(self, x):
            return self.used(x)

    rank, n, device = dist.get_rank(), dist.get_world_size(), rank_device()
    torch.manual_seed(0)
    net = TwoBranches().to(device)
    model = BucketedDataParallel(net, bucket_mb=0.0001, first_bucket_mb=None, allreduce=allreduce,
                                 find_unused_parameters=True)
    model(torch.full((2, 4), float(rank + 1), device=device)).sum().backward()   # x: (2, 4)
    mean = torch.full((3, 4), 2.0 * sum(r + 1 for r in range(n)) / n)   # d sum(Wx)/dW, averaged over ranks
    return ((net.used.weight.grad.cpu() - mean).abs().max().item(), net.unused.weight.grad is None,
            net.unused.bias.grad is None)


@pytest.mark.parametrize("backend", ["gloo", pytest.param("nccl", marks=needs_two)])
@pytest.mark.parametrize("allreduce", ["torch", "ring"])
def test_find_unused_parameters_on_cuda(backend, allreduce):
    with World(2, timeout=120, backend=backend) as world:
        for err, weight_none, bias_none in world.run(unused_on_cuda, allreduce):
            assert err < 1e-6 and weight_none and bias_none


def devices_and_sums():
    from ddnb.collectives.devices import rank_device

    device = rank_device()
    on_gpu, on_cpu = torch.ones(3, device=device), torch.ones(3)
    dist.all_reduce(on_gpu)
    dist.all_reduce(on_cpu)
    return dist.get_backend(), str(device), on_gpu.sum().item(), on_cpu.sum().item()


@needs_two
def test_auto_backend_one_rank_per_gpu_reduces_cpu_and_cuda_tensors():
    n = min(GPUS, 4)
    with World(n, timeout=120, backend="auto") as world:
        got = world.run(devices_and_sums)
    assert [g[1] for g in got] == [f"cuda:{r}" for r in range(n)]
    assert all(g[0] == "cpu:gloo,cuda:nccl" and g[2] == g[3] == 3.0 * n for g in got), got


@needs_two
@pytest.mark.parametrize("mode", ["bsp", "asp"])
def test_parameter_server_on_nccl(mode):
    """Pure nccl has no any-source receive: the server names its sources, messages on the GPU."""
    import functools

    from ddnb.data import digits
    from ddnb.models import mlp
    from ddnb.parameter_server import PSConfig, train

    n = min(GPUS, 3)
    config = PSConfig(mode=mode, steps=5, batch_size=16, lr=0.05)
    with World(n, timeout=120, backend="nccl") as world:
        res = world.run(train, config, functools.partial(mlp, (64, 32, 10), seed=0), digits()[0])
    server = [r for r in res if r["role"] == "server"][0]
    assert server["updates"] == (5 if mode == "bsp" else 5 * (n - 1)) and server["gradients"] == 5 * (n - 1)
