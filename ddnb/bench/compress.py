"""The gradient-compression benchmark behind `python -m ddnb.bench compress`:

    python -m ddnb.bench compress --workers 4 --json
    python -m ddnb.bench compress --workers 2 --steps 100 --methods none,powersgd:4,topk

Trains the digits MLP 64 → 256 → 256 → 10 (85,002 parameters, `ddnb.compression.train`)
with torch DDP on `--workers` gloo processes, once per method, the same seed, data and
steps for each, every bucket going through a ddnb.compression hook:

    none         the plain all-reduce, traced          4 bytes per element
    fp16, bf16   cast to 16 bits around the all-reduce  2 bytes per element
    powersgd:r   PowerSGD at rank r (r = 1, 4 by default), error feedback, warm start,
                 plain all-reduce for the first `--start` steps
    topk         the top 1% (`--ratio`) of each bucket, with error feedback, all-gathered
    sign         EF-SignSGD: 1 bit per element + a scale per tensor, all-gathered
    horovod:fp16 Horovod's Compression.fp16 (and horovod:none), hvd.DistributedOptimizer in a
                 Horovod world of its own; skipped with a message without Horovod
                 (`ddnb/bench/compress_horovod.py`)

A row: method, bytes_per_step (bytes one rank hands to the collectives in a compressed
step, from the trace), formula_bytes (`ddnb.compression.method_bytes`) and whether they
are equal, compression_ratio (none's bytes_per_step / this one's), total_bytes (all
steps, warm-up included), step_time (median seconds a step, the slowest rank's),
final_accuracy (test accuracy after the last step) and accuracy_drop (none's minus this
one's, in points). Taught in `notebooks/14_precision_compression.ipynb`.
"""
from __future__ import annotations

DEFAULT_METHODS = ("none", "fp16", "bf16", "powersgd:1", "powersgd:4", "topk", "sign", "horovod:fp16")


def parse_method(text: str) -> tuple[str, dict]:
    """"powersgd:4" -> ("powersgd", {"rank": 4}); "topk" -> ("topk", {})."""
    from ddnb.bench.compress_horovod import HOROVOD_METHODS
    from ddnb.compression import METHODS

    if text in HOROVOD_METHODS:                          # "horovod:fp16" -> ("fp16", {}): fp16's formula
        return HOROVOD_METHODS[text], {}
    name, _, arg = text.partition(":")
    if name not in METHODS or (arg and name != "powersgd") or (arg and not arg.isdigit()):
        raise ValueError(f"method {text!r}: need one of {', '.join(METHODS)}, or powersgd:R with R a rank >= 1, "
                         f"or {' or '.join(HOROVOD_METHODS)}")
    return name, ({"rank": int(arg)} if arg else {})


def rank_compress(methods, steps: int, per_rank: int, lr: float, start: int, ratio: float, seed: int) -> list:
    """On every rank: train once per method; per method (name, result of train_compressed
    less its parameters, step_time the slowest rank's)."""
    import torch
    import torch.distributed as dist

    from ddnb.compression.train import train_compressed

    out = []
    for text in methods:
        name, kw = parse_method(text)
        if name == "powersgd":
            kw.update(start=start)
        r = train_compressed(name, steps=steps, per_rank=per_rank, lr=lr, seed=seed, ratio=ratio, **kw)
        t = torch.tensor([r.pop("step_time")], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        r.pop("params")
        out.append((text, dict(r, step_time=t.item())))
    return out


def compress_rows(results, workers: int, ratio: float) -> list[dict]:
    from ddnb.compression import method_bytes

    rows = []
    for text, r in results:
        name, kw = parse_method(text)
        last = r["bytes"][max(r["bytes"])]
        formula = method_bytes(name, [r["shapes"]], ratio=ratio, **kw)
        rows.append({"method": text, "workers": workers, "bytes_per_step": last, "formula_bytes": formula,
                     "bytes_match_formula": last == formula, "total_bytes": sum(r["bytes"].values()),
                     "step_time": r["step_time"], "final_accuracy": r["accuracy"], "final_loss": r["losses"][-1]})
    base = next((row for row in rows if row["method"] == "none"), None)
    for row in rows:
        row["compression_ratio"] = None if base is None else base["bytes_per_step"] / row["bytes_per_step"]
        row["accuracy_drop"] = None if base is None else round(100 * (base["final_accuracy"] - row["final_accuracy"]), 2)
    return rows


def compress_benchmark(workers: int = 4, methods=DEFAULT_METHODS, steps: int = 150, per_rank: int = 32,
                       lr: float = 0.05, start: int = 10, ratio: float = 0.01, seed: int = 0,
                       timeout: float = 600) -> list[dict]:
    """The rows of `python -m ddnb.bench compress` (see the module docstring)."""
    from ddnb._checks import Checks
    from ddnb.testing import World

    with Checks("compress_benchmark") as check:
        check.integer("workers", workers, min=2)
        check.positive_ints(steps=steps, per_rank=per_rank)
        check.integer("start", start, min=2, why=" (PowerSGD's plain steps; >= 2 with error feedback)")
        check.number("ratio", ratio, positive=True, max=1)
        for m in methods:
            try:
                parse_method(m)
            except ValueError as e:
                check.rule(False, str(e))
    from ddnb.bench.compress_horovod import horovod_results, is_horovod

    results = []
    plain = [m for m in methods if not is_horovod(m)]
    if plain:
        with World(workers, timeout=timeout) as world:
            results = world.run(rank_compress, plain, steps, per_rank, lr, start, ratio, seed)[0]
    results += horovod_results(workers, [m for m in methods if is_horovod(m)], steps, per_rank, lr, seed, timeout)
    order = list(methods)
    return compress_rows(sorted(results, key=lambda r: order.index(r[0])), workers, ratio)


def compress_table(rows: list[dict]) -> str:
    lines = [f"{'method':<12} {'bytes/step':>11} {'formula':>8} {'ratio':>7} {'step time':>10} {'accuracy':>9}"]
    for r in rows:
        ratio = "" if r["compression_ratio"] is None else f"{r['compression_ratio']:.1f}x"
        lines.append(f"{r['method']:<12} {r['bytes_per_step']:>11,} {'=' if r['bytes_match_formula'] else '!=':>8} "
                     f"{ratio:>7} {r['step_time'] * 1e3:>7.2f} ms {r['final_accuracy']:>9.2%}")
    return "\n".join(lines)
