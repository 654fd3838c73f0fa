"""Gradient flow as it happens: for every layer of a deep MLP, on every rank, when backward
produced the layer's gradient and how large it was (this rank's own, local), which bucket it
travels in, when that bucket's all-reduce started and ended, and the averaged gradient after
the sync. Recorded live on real processes for four synchronizations:

    naive     NaiveDataParallel: one all-reduce per layer, all after backward (Li et al.,
              "PyTorch Distributed", VLDB 2020, Sec. 3.2.1)
    bucketed  BucketedDataParallel: buckets launched from autograd hooks during backward
              (Sec. 3.2.2-3.2.3)
    ddp       torch DistributedDataParallel, its buckets seen through a communication hook
              (`register_comm_hook`: the hook gets each bucket, `bucket.parameters()`, when
              the reducer launches it). Step 0 has one bucket: DDP does not know yet in
              which order backward produces the gradients, so it rebuilds its buckets in
              the order they arrived (Li et al. 2020, Sec. 3.2.3) from step 1 on
    horovod   hvd.DistributedOptimizer with `groups=` the same buckets (Sergeev & Del Balso
              2018, Sec. 6: tensor fusion), its grouped all-reduces stamped as they are
              submitted and polled until done

Every layer is one gradient tensor (Linear without bias, as many transformer blocks), so
"layer" and "gradient tensor" are the same thing and a bucket holds whole layers. The rule
overlap rests on, checked by the tests and notebook 06: a bucket's all-reduce starts no
earlier than the last of its layers' gradients (it cannot send what is not computed), and
after the sync every rank holds the same gradient, the global batch's (`naive.py`'s
equation ∇L_global = 1/N Σ_r ∇L_r).

Times are time.time() seconds from the start of `loss.backward()`, as this rank sees them; an
all-reduce's end is noticed at the next gradient hook or at the final wait (at most one hook
late; DDP's by a callback on its future). Taught in `notebooks/06_data_parallelism.ipynb`:

    data = gradient_flow(cluster, "bucketed", workers=4, steps=3, bucket_mb=0.03)
    ddnb.viz.gradient_flow.plot_gradient_flow(data, step=1)
"""
from __future__ import annotations

import time

from ddnb._checks import Checks
from ddnb.data_parallel.wrappers import STRATEGIES

MB = 1 << 20


def _check(strategy, steps, layers, width, bucket_mb, per_rank, lr, workers=None, world_size=None,
           horovod=None, where="record_gradient_flow") -> None:
    with Checks(where) as check:
        check.choice("strategy", strategy, STRATEGIES)
        check.positive_ints(steps=steps, width=width, per_rank=per_rank)
        check.integer("layers", layers, min=2, why=" (Linear layers, >= 2)")
        check.number("bucket_mb", bucket_mb, positive=True, why=" (megabytes)")
        check.number("lr", lr, positive=True)
        if world_size is not None:
            check.integer("workers", workers, min=2, max=world_size, none=True,
                          why=f" (ranks that train, 2..{world_size}, the world size)")
            check.rule(strategy != "horovod" or workers in (None, world_size),
                       f"strategy='horovod' with workers={workers}: Horovod all-reduces over all {world_size} "
                       f"ranks; use workers=None")
        if horovod is not None:
            check.rule(strategy != "horovod" or horovod, "strategy='horovod' needs Horovod initialized on every "
                       "rank: ddnb.Cluster(horovod=True) (or cluster.start_horovod()), World(n, horovod=True)")


def deep_mlp(layers: int = 10, width: int = 64, seed: int = 0):
    """Linear(64, width) -> ReLU -> (Linear(width, width) -> ReLU) x (layers-2) -> Linear(width, 10),
    no biases: one gradient tensor per layer. The same parameters on every rank (seeded)."""
    import torch
    from torch import nn

    sizes = [64] + [width] * (layers - 1) + [10]
    mods = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            mods.append(nn.Linear(a, b, bias=False))
            if i < layers - 1:
                mods.append(nn.ReLU())
    return nn.Sequential(*mods)


def _batches(items: int, workers: int, per_rank: int, steps: int, seed: int):
    """For each step, each rank's sample indices (its ShardSampler shard, `per_rank` a step)."""
    from ddnb.data_parallel import shard_indices

    shards = [shard_indices(items, workers, r, seed=seed, drop_last=True) for r in range(workers)]
    return [[s[(t * per_rank) % (len(s) - per_rank + 1):][:per_rank] for s in shards] for t in range(steps)]


def _buckets_of(layers: int, width: int, bucket_mb: float) -> list[list[int]]:
    from ddnb.data_parallel.bucketed import assign_buckets

    sizes = [64] + [width] * (layers - 1) + [10]
    nbytes = [a * b * 4 for a, b in zip(sizes[:-1], sizes[1:])]     # float32 weight (b, a)
    return assign_buckets(nbytes, ["f32"] * layers, int(bucket_mb * MB))


def record_gradient_flow(strategy: str = "bucketed", steps: int = 3, layers: int = 10, width: int = 64,
                         bucket_mb: float = 0.03, per_rank: int = 32, lr: float = 0.05, seed: int = 0,
                         workers: int | None = None) -> dict | None:
    """Run on every rank of an initialized world: train `deep_mlp(layers, width)` on the
    digits for `steps` SGD steps with `strategy` on ranks 0..workers-1 (default: all; the
    others return None) and record each step. Returns plain data:
    {"strategy", "rank", "workers", "bucket_mb", "layers": names, "steps": [per step:
     {"step", "local": [L] this rank's ‖grad‖ per layer, "time": [L] when backward produced it,
      "bucket": [L] the bucket id it travels in, "buckets": [{"id", "layers", "start", "end"}],
      "averaged": [L] ‖grad‖ after the sync, "backward_end", "sync_end"}]} (times in seconds
    from the start of backward)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from ddnb.data import digits
    from ddnb.trace import Tracer

    hvd = None
    if strategy == "horovod":
        import horovod.torch as hvd
        rank, world_size = (hvd.rank(), hvd.size()) if hvd.is_initialized() else (0, 0)
    else:
        rank, world_size = dist.get_rank(), dist.get_world_size()
    _check(strategy, steps, layers, width, bucket_mb, per_rank, lr, workers, world_size or None,
           horovod=hvd is not None and hvd.is_initialized() if strategy == "horovod" else None)
    n = workers or world_size
    group = dist.new_group(list(range(n))) if hvd is None and n < world_size else None   # every rank calls it
    if rank >= n:
        return None
    train_set, _ = digits(seed=0)
    model = deep_mlp(layers, width, seed)
    params = list(model.parameters())                                  # one per layer
    members = _buckets_of(layers, width, bucket_mb)
    t0, local, stamps, buckets = 0.0, [0.0] * layers, [0.0] * layers, {}
    pending = []                           # (bucket id, handle) not yet seen done (horovod)

    def poll():
        while pending and hvd.poll(pending[0][1]):
            buckets[pending.pop(0)[0]]["end"] = time.time() - t0

    def grad_hook(i):
        def hook(p):                       # runs before the wrapper's hooks: the local gradient
            stamps[i], local[i] = time.time() - t0, float(p.grad.norm())
            if pending:
                poll()
        return hook

    for i, p in enumerate(params):         # registered first, so they run before the wrapper's
        p.register_post_accumulate_grad_hook(grad_hook(i))
    tracer, sync = Tracer(), None
    if strategy == "naive":
        from ddnb.data_parallel import NaiveDataParallel
        wrapped = NaiveDataParallel(model, group=group, tracer=tracer)
        sync = wrapped.sync_gradients
    elif strategy == "bucketed":
        from ddnb.data_parallel import BucketedDataParallel
        wrapped = BucketedDataParallel(model, bucket_mb=bucket_mb, first_bucket_mb=None, group=group, tracer=tracer)
        members = wrapped.bucket_params
    elif strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        wrapped = DistributedDataParallel(model, process_group=group, bucket_cap_mb=bucket_mb)  # first bucket too
        index = {p.data_ptr(): i for i, p in enumerate(params)}

        def comm_hook(state, bucket):                  # DDP's default all-reduce, stamped
            start = time.time() - t0
            ids = [index[p.data_ptr()] for p in bucket.parameters()]
            buf = bucket.buffer().div_(dist.get_world_size(group))
            fut = dist.all_reduce(buf, group=group, async_op=True).get_future()
            entry = buckets[bucket.index()] = {"id": bucket.index(), "layers": ids, "start": start, "end": None}

            def done(f):
                entry["end"] = time.time() - t0
                return f.value()[0]
            return fut.then(done)
        wrapped.register_comm_hook(None, comm_hook)
    else:
        wrapped = model
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    if hvd is not None:
        from ddnb.data_parallel import horovod_optimizer
        opt = horovod_optimizer(model, opt, groups=[[params[i] for i in m] for m in members])
        bucket_id = {frozenset(id(params[i]) for i in m): k for k, m in enumerate(members)}
        submit = opt._grouped_allreduce_grad_async

        def traced(ps):                                # the hook of the group's last gradient
            start = time.time() - t0
            handle, ctxs = submit(ps)
            k = bucket_id[frozenset(map(id, ps))]
            buckets[k] = {"id": k, "layers": list(members[k]), "start": start, "end": None}
            pending.append((k, handle))
            return handle, ctxs
        opt._grouped_allreduce_grad_async = traced
    out = []
    for t, shards in enumerate(_batches(len(train_set), n, per_rank, steps, seed)):
        b = shards[rank]
        opt.zero_grad()
        loss = F.cross_entropy(wrapped(train_set.x[b]), train_set.y[b])
        buckets.clear()
        t0 = time.time()
        loss.backward()                    # bucketed, DDP: returns with the averaged gradients
        backward_end = max(stamps)
        if sync is not None:
            sync()                         # naive: one all-reduce per layer, now
        if hvd is not None:
            while pending:
                poll()
            opt.synchronize()
        sync_end = time.time() - t0
        if strategy in ("naive", "bucketed"):
            events = [e for e in tracer.take() if e["kind"] == "collective"]
            for k, e in enumerate(events):  # naive: one per layer, in layer order; bucketed: bucket k
                buckets[k] = {"id": k, "layers": [k] if strategy == "naive" else list(members[k]),
                              "start": e["start"] - t0, "end": e["end"] - t0}
        ordered = [buckets[k] for k in sorted(buckets)]
        bucket_of = [None] * layers
        for bk in ordered:
            for i in bk["layers"]:
                bucket_of[i] = bk["id"]
        out.append({"step": t, "local": list(local), "time": list(stamps), "bucket": bucket_of, "buckets": ordered,
                    "averaged": [float(p.grad.norm()) for p in params], "backward_end": backward_end,
                    "sync_end": sync_end})
        if hvd is not None:
            with opt.skip_synchronize():
                opt.step()
        else:
            opt.step()
    if hasattr(wrapped, "remove_hooks"):
        wrapped.remove_hooks()
    return {"strategy": strategy, "rank": rank, "workers": n, "bucket_mb": bucket_mb,
            "layers": [f"layer {i}" for i in range(layers)], "steps": out}


def reference_gradient_flow(workers: int, steps: int = 3, layers: int = 10, width: int = 64,
                            per_rank: int = 32, lr: float = 0.05, seed: int = 0) -> list[list[float]]:
    """One process, what the ranks' sync must give: for each step, ‖grad‖ per layer of the
    global batch (every rank's `per_rank` digits together), with the same SGD steps."""
    import torch
    import torch.nn.functional as F

    from ddnb.data import digits

    _check("naive", steps, layers, width, 1.0, per_rank, lr, where="reference_gradient_flow")
    train_set, _ = digits(seed=0)
    model = deep_mlp(layers, width, seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    out = []
    for shards in _batches(len(train_set), workers, per_rank, steps, seed):
        b = [i for s in shards for i in s]                  # the global batch, workers x per_rank
        opt.zero_grad()
        F.cross_entropy(model(train_set.x[b]), train_set.y[b]).backward()
        out.append([float(p.grad.norm()) for p in model.parameters()])
        opt.step()
    return out


def gradient_flow(cluster, strategy: str = "bucketed", workers: int | None = None, steps: int = 3, layers: int = 10,
                  width: int = 64, bucket_mb: float = 0.03, per_rank: int = 32, lr: float = 0.05,
                  seed: int = 0) -> list[dict]:
    """`record_gradient_flow` on the ranks of `cluster` (a ddnb.Cluster or ddnb.testing.World:
    anything with .run and .n), `workers` of them training (default all); returns the
    training ranks' records, in rank order. Bad arguments fail here, before any rank runs."""
    _check(strategy, steps, layers, width, bucket_mb, per_rank, lr, workers, cluster.n,
           horovod=bool(getattr(cluster, "horovod", False)), where="gradient_flow")
    got = cluster.run(record_gradient_flow, strategy, steps=steps, layers=layers, width=width, bucket_mb=bucket_mb,
                      per_rank=per_rank, lr=lr, seed=seed, workers=workers)
    return [r for r in got if r is not None]


def flow_invariants(data: list[dict], reference: list[list[float]] | None = None, tol: float = 1e-5) -> dict:
    """What must hold in every recorded step, as booleans: `buckets_cover_layers` (each layer
    in exactly one bucket), `overlap_rule` (each bucket's all-reduce starts no earlier than
    its layers' gradients were produced), `ranks_agree` (the averaged norms equal on every
    rank) and, given `reference_gradient_flow`'s norms, `equal_reference`; "equal": within a
    relative `tol`, layer by layer."""
    close = lambda got, want: all(abs(a - b) <= tol * abs(b) for a, b in zip(got, want))  # noqa: E731
    out = {"buckets_cover_layers": True, "overlap_rule": True, "ranks_agree": True}
    for t in range(min(len(r["steps"]) for r in data)):
        for r in data:
            s = r["steps"][t]
            owned = sorted(i for b in s["buckets"] for i in b["layers"])
            out["buckets_cover_layers"] &= owned == list(range(len(r["layers"])))
            out["overlap_rule"] &= all(b["start"] >= max(s["time"][i] for i in b["layers"]) for b in s["buckets"])
            out["ranks_agree"] &= close(s["averaged"], data[0]["steps"][t]["averaged"])
            if reference is not None:
                out["equal_reference"] = out.get("equal_reference", True) and close(s["averaged"], reference[t])
    return out
