"""Bucketed data parallelism with communication overlapped with backward: what
torch.nn.parallel.DistributedDataParallel does (Li et al., "PyTorch Distributed:
Experiences on Accelerating Data Parallel Training", VLDB 2020, Sec. 3.2.2-3.2.3), in
Python, so every step can be read.

`naive.py` pays one all-reduce latency α per parameter, and only after backward. Two fixes:

1. Buckets (Sec. 3.2.2): gradients are copied into a few flat buffers of ~`bucket_mb`
   each, and each buffer is all-reduced once, so k parameters pay α once, not k times:
       T_naive ≈ Σ_p (α + S_p β)       T_bucketed ≈ Σ_b (α + S_b β),  #buckets << #params
2. Overlap (Sec. 3.2.3): backward produces gradients from the last layer to the first,
   so buckets are filled in *reverse* order of registration, and a bucket's all-reduce
   is launched asynchronously the moment its last gradient arrives (an autograd
   post-accumulate-grad hook), while backward goes on computing earlier layers' gradients.
   Only the last bucket's all-reduce is left when backward ends. (Horovod's tensor
   fusion does the same from a background thread: Sergeev & Del Balso 2018, Sec. 6.)

Gloo (and NCCL) require every rank to issue collectives in the same order, so bucket i
is launched only when it is full *and* buckets 0..i-1 are launched. At the end of
backward (a callback queued on the autograd engine) any bucket still waiting for a
gradient that never came (an unused parameter) is filled with zeros there and launched,
so an unused parameter never hangs the others; then every all-reduce is awaited and the
averages copied back into `.grad`. Like DDP, gradients are divided by N as they are
copied into the bucket, so the all-reduce is a plain sum. The first bucket is small
(`first_bucket_mb`, 1 MB as DDP's), so communication starts early in backward.

Which all-reduce (`allreduce=`):
- "torch" (default): `dist.all_reduce(bucket, async_op=True)`; gloo runs it on its own
  C++ thread, so it truly overlaps backward (given a free core).
- a ddnb.collectives algorithm ("ring", "tree", ...): those are synchronous Python, so
  they run on one background thread of this wrapper, in bucket order. They overlap
  backward too, but share the GIL with it (their messages and arithmetic release it; their
  Python loop does not), so expect less overlap than with "torch".

In an emulated cluster (`ddnb.emulate`) the "torch" all-reduce is an `EmulatedAllReduce`
(the real one, timed by the messages of ddnb's ring sent over the emulated links) and every stamp below is
emulated time; the ddnb.collectives algorithms are refused there (their background thread
would not be paced).

Every step records, in the tracer: "compute"/"backward" (start of backward → end),
"collective"/"bucket k" (launch → completion, per bucket; completion as this rank sees
it, at the next gradient hook or at the final wait, since a Python callback on gloo's
thread would stall it), "wait"/"sync" (end of backward → grads averaged).
`overlap_stats(events)` computes from them the fraction of communication time hidden
behind backward. Taught in `notebooks/06_data_parallelism.ipynb`.

    model = BucketedDataParallel(model, bucket_mb=25)
    loss_fn(model(x), y).backward()     # returns with every p.grad = mean over ranks
    optimizer.step()
"""
from __future__ import annotations

import contextlib
import time
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed as dist
from torch import nn

from ddnb._checks import Checks
from ddnb.collectives import traced
from ddnb.data_parallel.naive import TORCH, allreduce_fn, grad_norms, validate_allreduce
from ddnb.data_parallel.replicate import check_replicas, replicate
from ddnb.emulate.clock import current, stamp   # stamp: time.time(), or the emulated time
from ddnb.trace import Tracer, get_tracer

MB = 1 << 20
FIRST_BUCKET_MB = 1.0  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES


def assign_buckets(nbytes: list[int], dtypes: list, bucket_bytes: int, first_bucket_bytes: int | None = None
                   ) -> list[list[int]]:
    """Group parameters into buckets: indices (into registration order) per bucket, in
    *reverse* registration order (the order backward produces them). A bucket is closed
    when the next parameter would take it past its size (the first bucket's is
    `first_bucket_bytes`) or has another dtype; a parameter larger than a bucket gets
    one of its own. E.g. nbytes=[4, 4, 4, 4], bucket_bytes=8 -> [[3, 2], [1, 0]]."""
    buckets, current, size = [], [], 0
    for i in reversed(range(len(nbytes))):
        cap = first_bucket_bytes if (first_bucket_bytes and not buckets) else bucket_bytes
        if current and (size + nbytes[i] > cap or dtypes[i] != dtypes[current[-1]]):
            buckets.append(current)
            current, size = [], 0
        current.append(i)
        size += nbytes[i]
    if current:
        buckets.append(current)
    return buckets


class BucketedDataParallel(nn.Module):
    """Wrap `module` like DDP: after `loss.backward()` every parameter's `.grad` holds
    the mean over the ranks of `group`.

    bucket_mb, first_bucket_mb: bucket sizes in MB (2^20 bytes), > 0.
    allreduce: "torch" (async, default) or a ddnb.collectives name (see module docstring).
    broadcast: copy rank 0's parameters and buffers at construction (else only check
        that the replicas are equal: ReplicaMismatchError on every rank if not).
    find_unused_parameters: a parameter with no gradient on *any* rank keeps
        `.grad = None` (DDP's find_unused_parameters=True semantic, Li et al. 2020,
        Sec. 3.2.3: a bitmap of used parameters, all-reduced: one more small all-reduce
        per step). With False (default) it gets a zero gradient.
        Either way an unused parameter never hangs: a rank without a gradient for it
        contributes zeros (or the .grad it accumulated under no_sync).
    record_grad_norms: keep each step's per-parameter gradient norms, before (local)
        and after (averaged) the all-reduce, in `grad_norm_history`.
    """

    def __init__(self, module: nn.Module, bucket_mb: float = 25.0, group=None, allreduce: str = TORCH,
                 tracer: Tracer | None = None, broadcast: bool = True, find_unused_parameters: bool = False,
                 first_bucket_mb: float | None = FIRST_BUCKET_MB, record_grad_norms: bool = False):
        super().__init__()
        with Checks("BucketedDataParallel") as check:
            check.number("bucket_mb", bucket_mb, positive=True, why=" (megabytes)")
            check.number("first_bucket_mb", first_bucket_mb, positive=True, none=True, why=" (megabytes)")
            validate_allreduce(allreduce, check)
            check.rule(current() is None or allreduce == TORCH,
                       f"allreduce={allreduce!r} in an emulated cluster: ddnb's algorithms run on a background "
                       "thread here, which the emulator does not pace; use allreduce='torch'")
        bucket_mb = float(bucket_mb)
        first_mb = bucket_mb if first_bucket_mb is None else min(float(first_bucket_mb), bucket_mb)
        self.module, self.group, self.allreduce, self.tracer = module, group, allreduce, tracer
        self.world_size = dist.get_world_size(group)
        self.find_unused_parameters, self.record_grad_norms = find_unused_parameters, record_grad_norms
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self.names, self.params = [n for n, _ in named], [p for _, p in named]
        members = assign_buckets([p.numel() * p.element_size() for p in self.params],
                                 [p.dtype for p in self.params], int(bucket_mb * MB), int(first_mb * MB))
        config = {"strategy": "bucketed", "allreduce": allreduce, "bucket_mb": bucket_mb, "first_bucket_mb": first_mb,
                  "find_unused_parameters": find_unused_parameters}
        if broadcast:
            replicate(module, group=group, config=config)
        else:
            check_replicas(module, group, config=config)
        # bucket k: a flat buffer (numel_k,); param i's gradient lives in its slice, viewed as
        # the param's shape: self._views[i], shape = p.shape
        self.bucket_params = members
        self.buckets, self._views, self._bucket_of = [], [None] * len(self.params), [0] * len(self.params)
        for k, idx in enumerate(members):
            p0 = self.params[idx[0]]
            buf = torch.zeros(sum(self.params[i].numel() for i in idx), dtype=p0.dtype, device=p0.device)
            offset = 0
            for i in idx:
                numel = self.params[i].numel()
                self._views[i] = buf[offset:offset + numel].view(self.params[i].shape)
                self._bucket_of[i] = k
                offset += numel
            self.buckets.append(buf)
        self._allreduce = allreduce_fn(allreduce, group, tracer)
        self._thread = None if allreduce == TORCH else ThreadPoolExecutor(1, thread_name_prefix="ddnb-bucket-allreduce")
        self._hooks = [p.register_post_accumulate_grad_hook(self._grad_hook(i)) for i, p in enumerate(self.params)]
        self.require_sync, self._sync_this_backward, self._in_backward = True, True, False
        self.grad_norm_history: list[dict] = []
        self.step = 0
        self._comm_hook = self._comm_state = None

    def register_comm_hook(self, state, hook) -> None:
        """Send every bucket through `hook(state, bucket) -> Future` instead of the all-reduce,
        as DDP's `register_comm_hook` (the same hooks run on both: ddnb.compression, or torch's
        ddp_comm_hooks). The bucket holds the local gradients, not divided by N: the hook
        averages; its future's value becomes the bucket. The hook traces its own messages (the
        "bucket k" events then carry nbytes=0). Once, before training."""
        with Checks("BucketedDataParallel.register_comm_hook") as check:
            check.rule(callable(hook), f"hook={hook!r} is not callable")
            check.rule(self._comm_hook is None, "a communication hook is already registered")
        self._comm_hook, self._comm_state = hook, state

    # ------------------------------------------------------------------ forward, no_sync
    def forward(self, *args, **kwargs):
        self._sync_this_backward = self.require_sync      # decided at forward, as DDP does
        out = self.module(*args, **kwargs)
        if self._sync_this_backward and torch.is_grad_enabled():
            values = out.values() if isinstance(out, dict) else out if isinstance(out, (tuple, list)) else (out,)
            for t in values:   # its gradient is the first one backward computes: backward has begun
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    t.register_hook(self._output_hook)
        return out

    @contextlib.contextmanager
    def no_sync(self):
        """Gradient accumulation (Li et al. 2020, Sec. 3.2.4): backward passes whose
        forward ran inside accumulate into `.grad` without communicating; the first
        backward after the block averages the sum."""
        old, self.require_sync = self.require_sync, False
        try:
            yield
        finally:
            self.require_sync = old

    # ------------------------------------------------------------------ during backward
    def _output_hook(self, grad):
        if not self._in_backward:
            self._begin_backward()

    def _begin_backward(self) -> None:
        self._in_backward, self._bw_start = True, stamp()
        self._ready = [False] * len(self.params)
        self._missing = [len(m) for m in self.bucket_params]    # gradients each bucket still waits for
        self._next, self._handles, self._stamped = 0, [], 0
        self._launched, self._done = [0.0] * (len(self.buckets) + 1), [0.0] * (len(self.buckets) + 1)
        self._before = [0.0] * len(self.params) if self.record_grad_norms else None
        torch.autograd.Variable._execution_engine.queue_callback(self._finalize)

    def _grad_hook(self, i: int):
        def hook(p):          # p.grad is final for this backward: count it; a full bucket is sent
            if not self._sync_this_backward:
                return
            if not self._in_backward:
                self._begin_backward()
            if self._ready[i]:
                raise RuntimeError(f"BucketedDataParallel: parameter {self.names[i]!r} received its gradient twice "
                                   f"in one backward (reentrant backward or checkpointing is not supported)")
            self._ready[i] = True
            if self.record_grad_norms:
                self._before[i] = float(p.grad.norm())
            if self._handles:
                self._poll()
            k = self._bucket_of[i]
            self._missing[k] -= 1
            if self._missing[k] == 0:
                self._bucket_full(k)
        return hook

    def _bucket_full(self, k: int) -> None:
        """Pack bucket k's gradients into its buffer, divided by N (so that the all-reduce
        is a plain sum: DDP does the same), then launch every bucket that is full and whose
        predecessors are launched: the same order on every rank."""
        views, grads, absent = [], [], []
        for i in self.bucket_params[k]:
            g = self.params[i].grad
            (absent if g is None else views).append(self._views[i])
            if g is not None:
                grads.append(g)
        if views:
            torch._foreach_copy_(views, grads)         # one call for the whole bucket
        for v in absent:                               # no gradient on this rank (unused): zeros
            v.zero_()
        if self._comm_hook is None:                    # a hook averages itself, as with DDP
            self.buckets[k].div_(self.world_size)      # (numel_k,)
        while self._next < len(self.buckets) and self._missing[self._next] == 0:
            self._handles.append(self._launch(self._next, self.buckets[self._next]))
            self._next += 1

    def _launch(self, k: int, buffer: torch.Tensor):
        """Start the sum all-reduce of `buffer` (bucket k); returns something to .wait() on."""
        self._launched[k] = stamp()
        if self._comm_hook is not None and k < len(self.buckets):   # ddnb.compression (not the `used` bitmap)
            from ddnb.compression.comm import Bucket, HookWork

            idx = self.bucket_params[k]
            return HookWork(self._comm_hook(self._comm_state, Bucket(
                k, buffer, [self._views[i] for i in idx], [self.params[i] for i in idx], len(self.buckets))), buffer)
        if self._thread is None:
            # torch's, through the one traced layer (emulated: timed by its ring's messages).
            # No Python completion callback on the Work: gloo would run it on its own thread,
            # which then waits for the GIL (held by backward's hooks) before starting the next
            # bucket. Completion is noticed by polling instead (`_poll`).
            return traced.all_reduce_async(buffer, self.group)

        def run():
            self._allreduce(buffer)
            self._done[k] = time.time()
        return self._thread.submit(run)

    def _poll(self) -> None:
        """Stamp the completion time of the all-reduces that have finished (checked at
        every gradient hook and before each wait: a stamp is at most one hook late)."""
        while self._stamped < len(self._handles):
            h = self._handles[self._stamped]
            if not (h.is_completed() if self._thread is None else h.done()):
                return
            self._done[self._stamped] = self._done[self._stamped] or time.time()
            self._stamped += 1

    # ------------------------------------------------------------------ end of backward
    @torch.no_grad()
    def _finalize(self) -> None:
        bw_end = stamp()
        try:
            local_used = [r or p.grad is not None for r, p in zip(self._ready, self.params)]
            for i in ([] if self._next == len(self.buckets) else range(len(self.params))):
                if not self._ready[i]:   # no gradient this backward: zeros, or the .grad accumulated under no_sync
                    if self.record_grad_norms:
                        g = self.params[i].grad
                        self._before[i] = 0.0 if g is None else float(g.norm())
                    self._missing[self._bucket_of[i]] -= 1
                    if self._missing[self._bucket_of[i]] == 0:
                        self._bucket_full(self._bucket_of[i])
            used = None
            if self.find_unused_parameters:   # one more collective, after the buckets, on every rank
                # on the buckets' device: an nccl world cannot all-reduce a CPU tensor
                used = torch.tensor(local_used, dtype=torch.float32, device=self.buckets[0].device)   # (P,)
                self._handles.append(self._launch(len(self.buckets), used))
            self._poll()
            for k, h in enumerate(self._handles):   # in launch order
                h.wait() if self._thread is None else h.result()
                self._done[k] = self._done[k] or getattr(h, "end", None) or stamp()
            used = None if used is None else used.tolist()   # one device-to-host copy, not one per parameter
            grads, means = [], []
            for i, p in enumerate(self.params):
                if used is not None and used[i] == 0:
                    continue                  # no rank has a gradient for it: leave .grad = None
                if p.grad is None:
                    p.grad = self._views[i].clone()
                else:
                    grads.append(p.grad)
                    means.append(self._views[i])
            if grads:
                torch._foreach_copy_(grads, means)     # .grad <- the mean over ranks
        finally:
            self._in_backward = False
        self._record(bw_end, stamp())

    def _record(self, bw_end: float, end: float) -> None:
        tr = get_tracer(self.tracer)
        tr.record("compute", "backward", self._bw_start, bw_end, step=self.step)
        for k, buf in enumerate(self.buckets):
            tr.record("collective", f"bucket {k}", self._launched[k], self._done[k] or end,
                      nbytes=0 if self._comm_hook else buf.numel() * buf.element_size(), step=self.step, bucket=k,
                      params=len(self.bucket_params[k]))
        tr.record("wait", "sync", bw_end, end, step=self.step)
        if self.record_grad_norms:
            self.grad_norm_history.append({"step": self.step, "before": list(self._before),
                                           "after": grad_norms(self.params)})
        self.step += 1

    def bucket_names(self) -> list[list[str]]:
        """The parameter names in each bucket, bucket 0 first (filled first by backward)."""
        return [[self.names[i] for i in idx] for idx in self.bucket_params]

    def remove_hooks(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self._thread is not None:
            self._thread.shutdown()


def union_intervals(intervals) -> list[tuple[float, float]]:
    """The (start, end) intervals merged where they overlap, sorted."""
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def overlap_stats(events: list[dict]) -> dict:
    """From BucketedDataParallel's events (any ranks, any steps): communication time
    (the union of the bucket all-reduces' launch → completion intervals, per rank and
    step, summed), the part of it before that step's backward ended, and their ratio,
    `fraction`: 1.0 = all communication hidden behind backward, 0.0 = none (naive).
    Also `backward` (the backward time, summed the same way) and `launched_in_backward`:
    in how many of the `steps` (rank, step) the first bucket's all-reduce was launched
    before backward ended, which is what makes overlap possible at all; how much of the
    communication then hides depends on how long backward has left to run."""
    steps: dict = {}
    for e in events:
        key = (e["rank"], e.get("step"))
        if e["kind"] == "compute" and e["name"] == "backward":
            steps.setdefault(key, [None, []])[0] = (e["start"], e["end"])
        elif e["kind"] == "collective" and "bucket" in e:
            steps.setdefault(key, [None, []])[1].append((e["start"], e["end"]))
    comm = hidden = backward = 0.0
    early = 0
    for bw, intervals in steps.values():
        if bw is not None:
            backward += bw[1] - bw[0]
            early += bool(intervals) and min(a for a, _ in intervals) < bw[1]
        for a, b in union_intervals(intervals):
            comm += b - a
            if bw is not None:
                hidden += max(0.0, min(b, bw[1]) - a)
    return {"comm": comm, "overlapped": hidden, "fraction": hidden / comm if comm > 0 else 0.0,
            "backward": backward, "launched_in_backward": early, "steps": len(steps)}
