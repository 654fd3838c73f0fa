"""The data-parallel benchmark behind `python -m ddnb.bench dp`:

    python -m ddnb.bench dp --workers 2 --json
    python -m ddnb.bench dp --workers 4 --bucket-mb 5 --allreduce ring
    python -m ddnb.bench dp --workers 1,2,4,8 --emulate ib --slowdown 1500 --json

Times one training step (zero_grad, forward, backward, gradient sync, SGD step) per
strategy, on a `ddnb.testing.World` of `--workers` gloo processes, for two models of
opposite shapes (forward FLOPs per sample = 2 · Σ in·out over the layers):

    many_small   40 × Linear(128, 128)   80 small tensors, 2.5 MiB, 1.3 MFLOP forward per
                                         sample: latency-bound, where one all-reduce per
                                         tensor (naive) hurts most
    few_large    3 × Linear(2048, 2048)  6 tensors, 48 MiB, 25.2 MFLOP forward per sample
                                         (19.2x many_small's; forward + backward 67.1 against
                                         3.9 MFLOP, 17x, by torch's FlopCounterMode):
                                         bandwidth- and compute-bound

so compare strategies within a model, not the models' step times with each other.

Strategies: "naive" (ddnb NaiveDataParallel), "bucketed" (ddnb BucketedDataParallel,
`--bucket-mb`, `--allreduce`), "ddp" (torch DistributedDataParallel, its default 25 MB
buckets), "horovod" (hvd.DistributedOptimizer; measured last, in a world of its own,
because an initialized Horovod's background thread keeps negotiating even when idle and
would slow the others on a small machine). The strategies of one world take turns, a
few steps each, `--rounds` times, so that background load hits them alike. A step's time
is the slowest rank's; a row reports the median over the timed steps (after `--warmup`),
`ddp_step_time` (DDP's, same model, same run) and, for "bucketed", the fraction of its
communication hidden behind backward (`ddnb.data_parallel.overlap_stats` on its trace).
Several worker counts (`--workers 1,2,4,8`) make a weak-scaling run (the batch per rank
fixed): each row gains `efficiency` = T(1) / T(N) for its model and strategy. In an
emulated cluster each row also carries the model of the same step (`ddnb.cost.dp_step`:
the device's roofline for compute, the ring's alpha-beta time per all-reduce, the
buckets placed on the link as each strategy issues them): `model_step_time`,
`model_efficiency`, `model_overlap`, and `error` = step_time / model_step_time - 1.
The emulated times come from the run (real hooks, real messages, paced operations), the
model from the formula: a bucketing or overlap bug shows as a gap between them.
Taught in `notebooks/06_data_parallelism.ipynb`, `notebooks/07_horovod.ipynb` and
`notebooks/12_scalability.ipynb`.
"""
from __future__ import annotations

import statistics

from ddnb.data_parallel.wrappers import STRATEGIES

MODELS = {"many_small": (128, 40), "few_large": (2048, 3)}   # name -> (width, layers)


def bench_model(name: str, seed: int = 0, width: int | None = None, layers: int | None = None):
    """`layers` × (Linear(width, width), ReLU) with the last ReLU dropped, seeded."""
    import torch
    from torch import nn

    if name not in MODELS:
        raise ValueError(f"model {name!r} is not one of {list(MODELS)}")
    w, d = MODELS[name]
    w, d = width or w, layers or d
    torch.manual_seed(seed)
    mods = []
    for i in range(d):
        mods += [nn.Linear(w, w)] + ([nn.ReLU()] if i < d - 1 else [])
    return nn.Sequential(*mods)


def wrap(strategy: str, model, lr: float = 0.01, bucket_mb: float = 25.0, allreduce: str = "torch", tracer=None):
    """(model, optimizer, sync): `model` wrapped for `strategy`
    (`ddnb.data_parallel.wrappers.make_wrapper`), a plain SGD optimizer on it (Horovod's
    averaging one for "horovod"), and sync(), what the strategy needs called after backward."""
    import torch

    from ddnb.data_parallel.wrappers import make_wrapper

    wrapped, sync = make_wrapper(strategy, model, bucket_mb=bucket_mb if strategy == "bucketed" else None,
                                 allreduce=allreduce, tracer=tracer)   # DDP: its default buckets
    opt = torch.optim.SGD(wrapped.parameters(), lr=lr)
    if strategy == "horovod":
        from ddnb.data_parallel import horovod_optimizer

        opt = horovod_optimizer(wrapped, opt)
    return wrapped, opt, sync


def rank_dp(model_name: str, strategies, batch: int = 32, steps: int = 20, warmup: int = 3, rounds: int = 4,
            bucket_mb: float = 25.0, allreduce: str = "torch", width: int | None = None,
            layers: int | None = None) -> dict:
    """On every rank: {strategy: {"times": per-step seconds (the slowest rank's), "overlap":
    overlap_stats of its trace or None}} for `model_name`. Each strategy trains its own
    replica; they take turns, steps/rounds timed steps each per round."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from ddnb.data_parallel import overlap_stats
    from ddnb.emulate import uncounted, warm_up
    from ddnb.timing import barrier_and_clock
    from ddnb.trace import Tracer

    runs = {}
    for s in strategies:
        tracer = Tracer()
        model, opt, sync = wrap(s, bench_model(model_name, width=width, layers=layers),
                                bucket_mb=bucket_mb, allreduce=allreduce, tracer=tracer)
        runs[s] = (model, opt, sync, tracer)
    width_ = width or MODELS[model_name][0]
    g = torch.Generator().manual_seed(1000 + dist.get_rank())
    x, y = torch.randn(batch, width_, generator=g), torch.randn(batch, width_, generator=g)   # (B, width)

    barrier, clock = barrier_and_clock()   # emulated ones in an emulated cluster

    def step(model, opt, sync):
        start = clock()
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        sync()
        opt.step()
        return clock() - start

    times = {s: [] for s in strategies}
    per_round = max(1, steps // rounds)
    for s, (model, opt, sync, tracer) in runs.items():
        with warm_up():                      # untimed: the emulator's report covers the timed steps
            for _ in range(warmup):
                step(model, opt, sync)
        tracer.clear()
    for _ in range(rounds):
        for s, (model, opt, sync, _) in runs.items():
            barrier()
            times[s] += [step(model, opt, sync) for _ in range(per_round)]
    out = {}
    for s, (model, *_, tracer) in runs.items():
        t = torch.tensor(times[s], dtype=torch.float64)
        with uncounted():                                  # bookkeeping, after the timed steps
            dist.all_reduce(t, op=dist.ReduceOp.MAX)      # a step ends when its slowest rank does
        out[s] = {"times": t.tolist(), "overlap": overlap_stats(tracer.take()) if s == "bucketed" else None,
                  "param_bytes": sum(p.numel() * p.element_size() for p in model.parameters())}
        if hasattr(model, "remove_hooks"):
            model.remove_hooks()
    return out


def _rows(model_name: str, results: dict, workers: int, batch: int) -> list[dict]:
    rows = []
    for s, r in results.items():
        ov = r["overlap"]
        rows.append({"model": model_name, "strategy": s, "workers": workers, "batch": batch,
                     "step_time": statistics.median(r["times"]), "steps": len(r["times"]),
                     "param_bytes": r["param_bytes"], "overlap": None if ov is None else ov["fraction"],
                     "comm_time": None if ov is None else ov["comm"] / max(1, ov["steps"])})
    return rows


def dp_rows(world, models=tuple(MODELS), strategies=STRATEGIES, batch: int = 32, steps: int = 20,
            warmup: int = 3, rounds: int = 4, bucket_mb: float = 25.0, allreduce: str = "torch",
            width: int | None = None, layers: int | None = None, log=None) -> list[dict]:
    """Rows {model, strategy, workers, batch, step_time, steps, param_bytes, overlap,
    comm_time, threads}, one per (model, strategy), measured on `world` (see `rank_dp`;
    threads: the ranks' intra-op threads, `ddnb.bench.allreduce.world_threads`)."""
    from ddnb.bench.allreduce import world_threads

    rows, threads = [], world_threads(world)
    for m in models:
        got = world.run(rank_dp, m, list(strategies), batch=batch, steps=steps, warmup=warmup, rounds=rounds,
                        bucket_mb=bucket_mb, allreduce=allreduce, width=width, layers=layers)[0]
        rows += [dict(r, threads=threads) for r in _rows(m, got, world.n, batch)]
        if log:
            log(f"{m} on {world.n} workers: " + ", ".join(f"{r['strategy']} {r['step_time'] * 1e3:.2f} ms"
                                                          for r in rows if r["model"] == m))
    return rows


def add_ddp_columns(rows: list[dict]) -> list[dict]:
    """Add ddp_step_time (DDP's step time for the row's model, None without a ddp row)
    and ratio_vs_ddp = step_time / ddp_step_time to every row."""
    for r in rows:
        ddp = next((d["step_time"] for d in rows if d["model"] == r["model"] and d["strategy"] == "ddp"), None)
        r["ddp_step_time"] = ddp
        r["ratio_vs_ddp"] = None if ddp is None else r["step_time"] / ddp
    return rows


def dp_benchmark(workers: int, models=tuple(MODELS), strategies=STRATEGIES, batch: int = 32, steps: int = 20,
                 warmup: int = 3, rounds: int = 4, bucket_mb: float = 25.0, allreduce: str = "torch",
                 timeout: float = 600, log=None, emulate=None, **model_kwargs) -> list[dict]:
    """What `python -m ddnb.bench dp` measures: `dp_rows` for the strategies but Horovod
    in one World, then Horovod in a World of its own; with `add_ddp_columns`, in the
    order (model, strategy). `emulate`: a profile (`ddnb.emulate`): every time is then
    emulated, each row says so ("emulated") and carries the run's overrun summary
    ("emulation"); Horovod is not emulated and is refused."""
    from ddnb.emulate import summary
    from ddnb.testing import World

    if emulate is not None and "horovod" in strategies:
        raise ValueError("emulate: Horovod is not emulated; leave it out of the strategies")
    kwargs = dict(batch=batch, steps=steps, warmup=warmup, rounds=rounds, bucket_mb=bucket_mb, allreduce=allreduce,
                  log=log, **model_kwargs)
    plain, rows = [s for s in strategies if s != "horovod"], []
    if plain:
        with World(workers, timeout=timeout, emulate=emulate) as world:
            rows += dp_rows(world, models, plain, **kwargs)
            emulation = summary(world.emulation_reports()) if world.emulate else None
            for r in rows:
                r.update(emulated=world.emulate.name if world.emulate else None, emulation=emulation)
    if "horovod" in strategies:
        with World(workers, timeout=timeout, horovod=True) as world:
            rows += dp_rows(world, models, ["horovod"], **kwargs)
    order = {s: i for i, s in enumerate(strategies)}
    rows.sort(key=lambda r: (list(models).index(r["model"]), order[r["strategy"]]))
    return add_ddp_columns(rows)


def dp_table(rows: list[dict]) -> str:
    lines = [f"{'model':<11} {'strategy':<9} {'step time':>10} {'vs ddp':>7} {'overlap':>8} {'comm/step':>10}"]
    for i, r in enumerate(rows):
        if i and r["model"] != rows[i - 1]["model"]:
            lines.append("")
        ratio = "" if r.get("ratio_vs_ddp") is None else f"{r['ratio_vs_ddp']:.2f}"
        overlap = "" if r["overlap"] is None else f"{r['overlap']:.0%}"
        comm = "" if r["comm_time"] is None else f"{r['comm_time'] * 1e3:.2f} ms"
        lines.append(f"{r['model']:<11} {r['strategy']:<9} {r['step_time'] * 1e3:>7.2f} ms {ratio:>7} {overlap:>8} "
                     f"{comm:>10}")
    return "\n".join(lines)


def add_model_columns(rows: list[dict], profile, batch: int = 32, bucket_mb: float = 25.0, **model_kwargs) -> list[dict]:
    """Add model_step_time, model_overlap and error (step_time / model - 1) to every row
    (`ddnb.cost.dp_step` on `profile`: the rows' model, batch and worker count; DDP with
    its default buckets, 25 MiB after a first of 1 MiB; bucketed with `bucket_mb`)."""
    import torch
    import torch.nn.functional as F

    from ddnb.cost.dp_step import compute_times, dp_step_time
    from ddnb.data_parallel.bucketed import FIRST_BUCKET_MB, MB
    from ddnb.emulate import get_profile

    profile = get_profile(profile)
    cache = {}
    for r in rows:
        if r["model"] not in cache:
            model = bench_model(r["model"], **model_kwargs)
            w = model[0].in_features
            x, y = torch.zeros(batch, w), torch.zeros(batch, w)   # (B, width): the cost depends on shapes only
            cache[r["model"]] = compute_times(model, x, y, F.mse_loss, profile)
        n = r["workers"]
        link = profile.inter if len({profile.host(k) for k in range(n)}) > 1 else profile.intra
        buckets = (int(bucket_mb * MB), int(min(FIRST_BUCKET_MB, bucket_mb) * MB)) if r["strategy"] == "bucketed" \
            else (25 * MB, 1 * MB)
        m = dp_step_time(cache[r["model"]], r["strategy"], n, link.alpha, link.bandwidth, *buckets,
                         memory_bandwidth=profile.memory_bandwidth)
        r.update(model_step_time=m["step_time"], model_overlap=m["overlap"],
                 error=r["step_time"] / m["step_time"] - 1)
    return rows


def add_efficiency(rows: list[dict]) -> list[dict]:
    """efficiency = T(1) / T(N) (weak scaling) for each row's model and strategy, and
    model_efficiency likewise from model_step_time where present; None without a 1-worker row."""
    for r in rows:
        one = next((o for o in rows if o["workers"] == 1 and o["model"] == r["model"]
                    and o["strategy"] == r["strategy"]), None)
        r["efficiency"] = None if one is None else one["step_time"] / r["step_time"]
        if "model_step_time" in r:
            r["model_efficiency"] = None if one is None else one["model_step_time"] / r["model_step_time"]
    return rows


def dp_scaling(workers: list[int], models=tuple(MODELS), strategies=("naive", "bucketed", "ddp"), batch: int = 32,
               emulate=None, bucket_mb: float = 25.0, **kwargs) -> list[dict]:
    """`dp_benchmark` for each worker count in turn (one World at a time), the rows
    joined, with `add_model_columns` (emulated only) and `add_efficiency`."""
    rows = []
    for n in workers:
        got = dp_benchmark(n, models, strategies, batch=batch, emulate=emulate, bucket_mb=bucket_mb, **kwargs)
        if emulate is not None:
            add_model_columns(got, emulate, batch=batch, bucket_mb=bucket_mb,
                              **{k: kwargs[k] for k in ("width", "layers") if k in kwargs})
        rows += got
    return add_efficiency(rows)


def overlap_by_profile(profiles, workers: int = 4, model: str = "few_large", batch: int = 128,
                       bucket_mb: float = 25.0, timeout: float = 600, **kwargs) -> list[dict]:
    """Bucketed data parallelism on each emulated profile in turn (one World, re-emulated
    with `World.emulate_as`): `dp_rows` with the run's overlap (`overlap_stats`: the part
    of the bucket all-reduces that ran while backward was still running) beside the
    model's (`add_model_columns`), each row labelled with its profile and overrun summary.
    Overlap appears when a bucket's all-reduce is short next to the rest of backward."""
    from ddnb.emulate import get_profile, summary
    from ddnb.testing import World

    profiles = [get_profile(p) for p in profiles]     # a bad name fails before any process starts
    model_kwargs = {k: kwargs[k] for k in ("width", "layers") if k in kwargs}
    rows = []
    with World(workers, timeout=timeout) as world:
        for profile in profiles:
            world.emulate_as(profile)
            got = dp_rows(world, (model,), ("bucketed",), batch=batch, bucket_mb=bucket_mb, **kwargs)
            add_model_columns(got, profile, batch=batch, bucket_mb=bucket_mb, **model_kwargs)
            emulation = summary(world.emulation_reports())
            rows += [dict(r, emulated=profile.name, emulation=emulation) for r in got]
    return rows


def dp_scaling_table(rows: list[dict]) -> str:
    """One line per (model, strategy, workers): step time, efficiency, overlap, and the model's."""
    modeled = any("model_step_time" in r for r in rows)
    head = f"{'model':<11} {'strategy':<9} {'N':>3} {'step time':>11} {'eff':>6} {'overlap':>8}"
    lines = [head + (f" {'model step':>11} {'eff':>6} {'overlap':>8} {'error':>7}" if modeled else "")]
    pct = lambda v: "" if v is None else f"{v:.0%}"  # noqa: E731
    for r in sorted(rows, key=lambda r: (r["model"], r["strategy"], r["workers"])):
        line = (f"{r['model']:<11} {r['strategy']:<9} {r['workers']:>3} {r['step_time'] * 1e3:>8.3f} ms "
                f"{pct(r['efficiency']):>6} {pct(r['overlap']):>8}")
        if modeled:
            line += (f" {r['model_step_time'] * 1e3:>8.3f} ms {pct(r['model_efficiency']):>6} "
                     f"{pct(r['model_overlap']):>8} {r['error']:>+7.1%}")
        lines.append(line)
    return "\n".join(lines)
