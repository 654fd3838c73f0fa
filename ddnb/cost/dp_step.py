"""The step time of data-parallel training, as a model: the compute of one worker from the
device's roofline, then the gradient all-reduces from the alpha-beta model, placed on a
timeline the way each strategy issues them. The emulated cluster's `python -m ddnb.bench dp
--emulate` measures the same step on real processes (real hooks, real messages, paced
operations); this module predicts it without running anything distributed.

Compute (`compute_times`): forward, backward and the optimizer step of one worker, run
once in this process, each aten operation charged max(FLOPs / (peak x MFU), bytes /
memory bandwidth) (the roofline, Williams et al. 2009; FLOPs by torch.utils.flop_counter),
with the moment every parameter's gradient is ready in backward.

Communication, on N workers over the profile's link (alpha, B), the ring all-reduce of n
bytes taking 2(N-1) alpha + 2 (N-1)/N n / B (Patarasuk & Yuan 2009; `cost.allreduce_time`):

    naive      T = F + Bw + sum_p ring(n_p) + U            (one all-reduce per tensor, after backward)
    bucketed   buckets in reverse registration order (`assign_buckets`; DDP's own rule for
    / ddp      ddp, `ddp_buckets`); bucket k is ready at r_k (its last gradient); the link
               sends one bucket at a time:
                   s_k = max(r_k, e_{k-1}),  e_k = s_k + ring(n_k)
               T = F + max(Bw, e_last) + U                 (Li et al. 2020, "PyTorch Distributed", Sec. 3.2)

F, Bw, U: forward, backward, optimizer seconds. The wrappers' own memory passes over the
gradients are device time too, each n bytes read and written at the memory bandwidth M
(counted as the roofline charge counts an operation's arguments and result): naive
divides each gradient by N after its all-reduce (2n / M); ddnb's bucketed wrapper copies
a bucket in (`_foreach_copy_`, 2n / M) and divides it (2n / M) when it is full, which
delays the rest of backward, and copies the means out after the last all-reduce
(2n / M); DDP's reducer does the same with `copy_` (3n / M in, 3n / M out: the
destination counts as argument and result). The overlap fraction is the share of the
union of the intervals [r_k, e_k] that lies before backward ends, as
`ddnb.data_parallel.overlap_stats` measures it. Weak scaling efficiency: T(1) / T(N).
What it leaves out: the launch of each all-reduce (a MAX of launch times, uncharged);
the link is the slowest one any two ranks share (`Profile.link`), as the emulator charges
torch's all-reduce. Taught in `notebooks/06_data_parallelism.ipynb` and `notebooks/12_scalability.ipynb`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ddnb._checks import Checks
from ddnb.cost.alpha_beta import allreduce_time

STRATEGIES = ("naive", "bucketed", "ddp")


@dataclass
class ComputeTimes:
    """One worker's step in seconds of a profile's device. ready[i]: seconds after backward
    began at which parameter i's gradient was complete (registration order)."""
    forward: float
    backward: float
    optimizer: float
    ready: list
    nbytes: list
    dtypes: list


class _Charge(TorchDispatchMode):
    def __init__(self, profile):
        super().__init__()
        self.profile, self.t = profile, 0.0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from ddnb.emulate.compute import op_cost

        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        flops, nbytes = op_cost(func, args, kwargs, out)
        self.t += self.profile.compute_time(flops, nbytes) if (flops or nbytes) else 0.0
        return out


def charged_time(fn, profile) -> float:
    """Seconds of `profile`'s device for the aten operations `fn()` runs here, each charged
    as the emulator charges it (the roofline above); fn runs for real, in this process."""
    from ddnb.emulate import get_profile

    mode = _Charge(get_profile(profile))
    with mode:
        fn()
    return mode.t


def compute_times(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor, loss_fn, profile,
                  lr: float = 0.01) -> ComputeTimes:
    """Charge one step of `model` (forward, loss, backward, SGD step) on `profile`'s device.
    Runs on a copy's gradients: `model`'s parameters are restored afterwards."""
    from ddnb.emulate import get_profile

    profile = get_profile(profile)
    params = [p for p in model.parameters() if p.requires_grad]
    saved = [p.detach().clone() for p in params]
    ready = [None] * len(params)
    mode = _Charge(profile)
    handles = []
    for i, p in enumerate(params):
        def hook(_, i=i):
            ready[i] = mode.t
        handles.append(p.register_post_accumulate_grad_hook(hook))
    opt = torch.optim.SGD(params, lr=lr)
    try:
        opt.zero_grad(set_to_none=True)
        with mode:
            loss = loss_fn(model(inputs), targets)
            forward = mode.t
            loss.backward()
            backward = mode.t - forward
            opt.step()
            optimizer = mode.t - forward - backward
    finally:
        for h in handles:
            h.remove()
        with torch.no_grad():
            for p, s in zip(params, saved):
                p.copy_(s)
                p.grad = None
    return ComputeTimes(forward, backward, optimizer, [r - forward for r in ready],
                        [p.numel() * p.element_size() for p in params], [p.dtype for p in params])


def _union_before(intervals, end: float) -> tuple[float, float]:
    """(length of the union of `intervals`, the part of it before `end`), as overlap_stats counts."""
    from ddnb.data_parallel.bucketed import union_intervals

    merged = union_intervals(intervals)
    return sum(b - a for a, b in merged), sum(max(0.0, min(b, end) - a) for a, b in merged)


def ddp_buckets(nbytes: list[int], dtypes: list, bucket_bytes: int, first_bucket_bytes: int) -> list[list[int]]:
    """DDP's buckets once rebuilt after the first step (gradients ready in reverse
    registration order): a parameter is added, then the bucket closes when it holds at
    least its limit, the first bucket's being `first_bucket_bytes` (torch's
    `_compute_bucket_assignment_by_size`). Unlike `assign_buckets`, which closes a bucket
    before a parameter would overfill it, the 1 MiB first bucket can hold a 4 MiB weight."""
    buckets, open_ = [], {}
    for i in reversed(range(len(nbytes))):
        members, size = open_.get(dtypes[i], ([], 0))
        members, size = members + [i], size + nbytes[i]
        if size >= (first_bucket_bytes if not buckets else bucket_bytes):
            buckets.append(members)
            open_.pop(dtypes[i], None)
        else:
            open_[dtypes[i]] = (members, size)
    return buckets + [m for m, _ in open_.values()]


# passes of n bytes over memory per gradient byte: (when a bucket is full, after the last all-reduce)
WRAPPER_PASSES = {"naive": (0.0, 1.0), "bucketed": (2.0, 1.0), "ddp": (2.5, 1.5)}


def dp_step_time(times: ComputeTimes, strategy: str, workers: int, alpha: float, bandwidth: float,
                 bucket_bytes: int = 25 << 20, first_bucket_bytes: int | None = 1 << 20,
                 memory_bandwidth: float | None = None) -> dict:
    """The modeled step: {"step_time", "comm" (seconds the link is busy), "overlap" (the
    hidden share, as overlap_stats measures it; None for naive)} for `strategy` on
    `workers` workers, each all-reduce a ring on a link of latency `alpha` (s) and
    `bandwidth` (bytes/s). Bucketed and ddp: buckets of `bucket_bytes`, the first one of
    `first_bucket_bytes` (DDP's defaults: 25 MiB, 1 MiB). memory_bandwidth (bytes/s): the
    device's, for the wrappers' passes over the gradients (WRAPPER_PASSES); None leaves them out."""
    from ddnb.data_parallel.bucketed import assign_buckets

    with Checks("dp_step_time") as check:
        check.choice("strategy", strategy, STRATEGIES)
        check.integer("workers", workers, min=1)
        check.number("alpha", alpha, min=0, why=" (seconds)")
        check.number("bandwidth", bandwidth, positive=True, why=" (bytes/s)")
        check.integer("bucket_bytes", bucket_bytes, min=1)
        check.integer("first_bucket_bytes", first_bucket_bytes, min=1, none=True)
        check.number("memory_bandwidth", memory_bandwidth, positive=True, none=True, why=" (bytes/s)")
    ring = lambda n: allreduce_time("ring", n, workers, alpha, 1 / bandwidth, 0.0) if workers > 1 else 0.0  # noqa: E731
    f, bw, u = times.forward, times.backward, times.optimizer
    full, after = WRAPPER_PASSES[strategy]
    passes = lambda n, k: 2 * k * n / memory_bandwidth if memory_bandwidth else 0.0  # noqa: E731
    if strategy == "naive":
        comm = sum(ring(n) for n in times.nbytes)
        divide = sum(passes(n, after) for n in times.nbytes)
        return {"step_time": f + bw + comm + divide + u, "comm": comm, "overlap": None}
    end, delay, intervals = 0.0, 0.0, []
    layout = ddp_buckets if strategy == "ddp" else assign_buckets
    for bucket in layout(times.nbytes, times.dtypes, bucket_bytes, first_bucket_bytes or bucket_bytes):
        n = sum(times.nbytes[i] for i in bucket)
        delay += passes(n, full)                       # copy in and divide: backward waits for it
        r = max(times.ready[i] for i in bucket) + delay
        start = max(r, end)
        end = start + ring(n)
        intervals.append((r, end))
    bw += delay
    comm, hidden = _union_before(intervals, bw) if workers > 1 else (0.0, 0.0)
    copy_out = passes(sum(times.nbytes), after)
    return {"step_time": f + max(bw, end) + copy_out + u, "comm": comm,
            "overlap": hidden / comm if comm > 0 else 0.0}
