"""Checker for bucketed, overlapped data parallelism written by hand (06): the core of
DDP's reducer (Li et al., "PyTorch Distributed: Experiences on Accelerating Data Parallel
Training", VLDB 2020, Sec. 3.2.2 buckets, Sec. 3.2.3 overlap), the learner's class

    sync = MyBucketSync(params, buckets)    # registers one post-accumulate-grad hook per parameter
    loss.backward()                         # a bucket's all-reduce starts when its last gradient is ready
    sync.finish()                           # wait for every launched all-reduce, .grad <- the mean
    optimizer.step()

`buckets` are index lists into `params`, bucket 0 first, cut in reverse order of the
parameters (the order backward produces them) by `ddnb.data_parallel.bucketed.assign_buckets`.
Run on real processes (3 and 4), each with its own batches, for a few steps of SGD on a
4-layer MLP in 3 buckets. Checked, per rank and step, by wrapping `dist.all_reduce` and
logging, from hooks registered before the learner's, when backward produces each gradient:
each bucket all-reduced exactly once, asynchronously, the first one launched before backward
produced its last gradient (overlap: T_step ~ T_backward + the last bucket's all-reduce, not
T_backward + all of them), every launched all-reduce waited for in finish(); then the
gradients after step 0 equal the mean of the ranks' gradients and the parameters after the
last step equal one process's SGD on the concatenated global batch (1e-5).
Taught in `notebooks/06_data_parallelism.ipynb`; the library's version is
`ddnb.data_parallel.bucketed.BucketedDataParallel`.

    check_bucketed(MyBucketSync)
"""
from __future__ import annotations

import collections
import types

import torch

from ddnb._checks import Checks
from ddnb.exercises.core import compare, passed, run_on_ranks

SIZES = (8, 32, 32, 16, 4)       # Linear(8, 32) -> ReLU -> Linear(32, 32) -> ReLU -> ... -> Linear(16, 4)
BUCKET_BYTES = 4096              # -> 3 buckets of 628, 1024 and 288 floats (distinct: a launch names its bucket)
BATCH, LR = 6, 0.1
REFUSED = ("DistributedDataParallel", "BucketedDataParallel")


def model() -> torch.nn.Sequential:
    """The MLP every rank (and the reference) starts from: the same parameters everywhere."""
    from ddnb.models import mlp

    return mlp(SIZES, seed=0)


def buckets() -> list[list[int]]:
    """The buckets the checker passes: indices into model().parameters(), bucket 0 first."""
    from ddnb.data_parallel.bucketed import assign_buckets

    params = list(model().parameters())
    return assign_buckets([p.numel() * p.element_size() for p in params], [p.dtype for p in params], BUCKET_BYTES)


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank `rank`'s (x (BATCH, 8), y (BATCH, 4)) at `step`: every rank and step its own."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(BATCH, SIZES[0], generator=g), torch.randn(BATCH, SIZES[-1], generator=g)


def flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def reference(world_size: int, steps: int) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
    """One process: (parameters after `steps` of SGD on the concatenated global batch,
    each rank's own gradient at step 0, the global batch's gradient at step 0)."""
    import torch.nn.functional as F

    m = model()
    local = []
    for r in range(world_size):
        m.zero_grad()
        x, y = batch(r, 0)
        F.mse_loss(m(x), y).backward()
        local.append(flat(p.grad for p in m.parameters()))
    opt = torch.optim.SGD(m.parameters(), lr=LR)
    for step in range(steps):
        opt.zero_grad()
        xs, ys = zip(*[batch(r, step) for r in range(world_size)])
        F.mse_loss(m(torch.cat(xs)), torch.cat(ys)).backward()
        if step == 0:
            mean = flat(p.grad for p in m.parameters())
        opt.step()
    return flat(m.parameters()), local, mean


class _Work:
    """dist.all_reduce's Work, noting whether it was waited for (wait() or get_future())."""

    def __init__(self, work):
        self._work, self.waited = work, False

    def wait(self, *args, **kwargs):
        self.waited = True
        return self._work.wait(*args, **kwargs)

    def get_future(self):
        self.waited = True
        return self._work.get_future()

    def __getattr__(self, name):
        return getattr(self._work, name)


def _refuse(*args, **kwargs):
    raise AssertionError("check_bucketed: the library's data-parallel wrappers (DistributedDataParallel, "
                         "BucketedDataParallel) are what this exercise writes: register the hooks yourself")


def _run(cls, bucket_list, steps: int) -> dict:
    """On every rank: `steps` of SGD with the learner's class; the log of gradients produced
    and all-reduces launched per step, the all-reduces not waited for, the gradients after
    step 0's finish() and the parameters at the end."""
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from ddnb.data_parallel.bucketed import BucketedDataParallel

    rank, m = dist.get_rank(), model()
    params = list(m.parameters())
    log, step = [], [0]
    for i, p in enumerate(params):       # before the learner's hooks: a gradient is logged before its use
        p.register_post_accumulate_grad_hook(lambda p, i=i: log.append((step[0], "grad", i)))
    real, works = dist.all_reduce, []

    def logged(tensor, *args, **kwargs):
        async_op = kwargs.get("async_op", args[2] if len(args) > 2 else False)
        log.append((step[0], "launch", tensor.numel(), bool(async_op)))
        work = real(tensor, *args, **kwargs)
        if work is None:
            return None
        works.append((step[0], tensor.numel(), _Work(work)))
        return works[-1][2]

    saved = [(c, c.__init__) for c in (DistributedDataParallel, BucketedDataParallel)]
    dist.all_reduce = logged
    for c, _ in saved:
        c.__init__ = _refuse
    try:
        sync = cls(params, [list(b) for b in bucket_list])
        opt = torch.optim.SGD(params, lr=LR)
        for step[0] in range(steps):
            opt.zero_grad()
            x, y = batch(rank, step[0])
            F.mse_loss(m(x), y).backward()
            sync.finish()
            if step[0] == 0:
                grads0 = flat(p.grad if p.grad is not None else torch.zeros_like(p) for p in params)
            opt.step()
    finally:
        dist.all_reduce = real
        for c, init in saved:
            c.__init__ = init
        for _, _, w in works:            # leave no collective pending in the world
            if not w.waited:
                w._work.wait()
    return {"log": log, "unwaited": [(s, n) for s, n, w in works if not w.waited], "grads0": grads0,
            "params": flat(params)}


def _names(obj) -> set[str]:
    """Every global and attribute name used by obj's code (a function, or a class's methods),
    nested functions included."""
    fns = [v for v in vars(obj).values() if isinstance(v, types.FunctionType)] if isinstance(obj, type) else [obj]
    codes, names = [getattr(f, "__code__", None) for f in fns], set()
    while codes:
        code = codes.pop()
        if code is not None:
            names |= set(code.co_names)
            codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return names


def _check_step(rank: int, s: int, events: list, sizes: list[int], unwaited: list) -> None:
    """AssertionError when rank `rank`'s step `s` did not launch each bucket once, async,
    before backward ended, or left an all-reduce unwaited."""
    launches = [(pos, e) for pos, e in enumerate(events) if e[1] == "launch"]
    got = sorted(e[2] for _, e in launches)
    where = f"rank {rank}, step {s}"
    if not launches:
        raise AssertionError(f"{where}: no dist.all_reduce was launched. Launch each bucket's all-reduce from "
                             f"the gradient hook when its last gradient is ready (call it as dist.all_reduce: the "
                             f"checker counts those), and reset the ready counts in finish() for the next step")
    last_grad = max(pos for pos, e in enumerate(events) if e[1] == "grad")
    if launches[0][0] > last_grad:
        raise AssertionError(
            f"{where}: the first all-reduce was launched after backward produced its last gradient: nothing "
            f"overlaps backward. Launch a bucket's all-reduce from the parameters' post-accumulate-grad hook, as "
            f"soon as the bucket's last gradient is ready, not after backward (in finish() only wait)")
    if got != sorted(sizes):
        raise AssertionError(
            f"{where}: all-reduces of {got} elements; the buckets hold {sorted(sizes)}: one all-reduce per bucket, "
            f"each bucket exactly once a step, of its gradients flattened into one tensor (torch.cat); "
            f"reset the ready counts in finish() for the next step")
    sync = [e[2] for _, e in launches if not e[3]]
    if sync:
        raise AssertionError(f"{where}: the all-reduce of the bucket of {sync[0]} elements was blocking: launch it "
                             f"with async_op=True, so backward goes on while it runs, and wait in finish()")
    left = [n for t, n in unwaited if t == s]
    if left:
        raise AssertionError(f"{where}: the all-reduce of the bucket of {left[0]} elements was never waited for: "
                             f"call work.wait() in finish() before reading the bucket (it may not be summed yet)")


def check_bucketed(cls, world_sizes=(3, 4), steps: int = 3, timeout: float = 30) -> str:
    """Train with `cls(params, buckets)` on real processes (each world size), `steps` of
    SGD, each rank on its own batches: backward, `finish()`, step. `buckets` are lists of
    indices into `params`, bucket 0 first (reverse order: filled first by backward).
    Checks each step's all-reduces (one per bucket, async, the first launched before the
    last gradient, all waited for), the gradients after step 0 (the mean over the ranks)
    and the parameters after the last step (one process on the global batch, 1e-5)."""
    with Checks("check_bucketed") as check:
        check.rule(callable(cls), f"cls={cls!r}: need a class cls(params, buckets) with a method finish()")
        check.rule(isinstance(world_sizes, (list, tuple)) and len(world_sizes) > 0
                   and all(isinstance(n, int) and 2 <= n <= 8 for n in world_sizes),
                   f"world_sizes={world_sizes!r}: need a list of integers 2..8")
        check.integer("steps", steps, min=1, max=20)
    used = _names(cls) & set(REFUSED)
    if used:
        raise AssertionError(f"{getattr(cls, '__name__', 'your class')} uses {sorted(used)[0]}: this exercise "
                             f"writes what it does. Register a post-accumulate-grad hook per parameter and launch "
                             f"each bucket's all-reduce yourself")
    bucket_list = buckets()
    params = list(model().parameters())
    sizes = [sum(params[i].numel() for i in b) for b in bucket_list]
    for n in world_sizes:
        got = run_on_ranks(_run, n, cls, bucket_list, steps, what=getattr(cls, "__name__", "your class"),
                           timeout=timeout)
        final, local, mean = reference(n, steps)
        for rank, out in enumerate(got):
            per_step = collections.defaultdict(list)
            for e in out["log"]:
                per_step[e[0]].append(e)
            for s in range(steps):
                _check_step(rank, s, per_step[s], sizes, out["unwaited"])
            g = out["grads0"]
            hint = "average every bucket: the summed bucket divided by the world size, copied back at its offset"
            if torch.allclose(g, mean * n, atol=1e-6):
                hint = "every gradient is the sum, not the mean: divide the all-reduced bucket by the world size"
            elif torch.allclose(g, local[rank], atol=1e-6):
                hint = (f"rank {rank} kept its own gradient: copy the averaged bucket back into each .grad "
                        f"(the all-reduce sums a flat copy, not .grad itself)")
            compare(g, mean, rank=rank, name=f"gradients after finish() at step 0, {n} processes", hint=hint)
            compare(out["params"], final, rank=rank, name=f"parameters after {steps} steps, {n} processes",
                    hint="one process's SGD on the concatenated global batch: each step's .grad must be that "
                         "step's mean over the ranks, before optimizer.step()")
    return passed("check_bucketed", f"{len(sizes)} buckets, each all-reduced once a step and the first launched "
                                    f"during backward; parameters equal one process on the global batch after "
                                    f"{steps} steps on {list(world_sizes)} processes")
