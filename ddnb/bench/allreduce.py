"""Benchmarks from the command line, in the style of nccl-tests:

    python -m ddnb.bench allreduce --workers 4 --sizes 64KB..64MB --fit
    ddnb bench allreduce --workers 2 --sizes 4KB,1MB,16MB --algorithms ring,torch --json

`allreduce` times ddnb's from-scratch all-reduces (ring, tree, naive, halving_doubling),
torch.distributed's and Horovod's on a `ddnb.testing.World` of `--workers` gloo
processes, for each size. Per (size, algorithm) it reports the time of one call: doubling
probes (1, 2, 4, ... calls) find a call count k that makes --repeats windows last about
--seconds *together* (each window ~--seconds / --repeats; k at most 10,000); each window
is one warm-up call, a barrier, then k back-to-back calls on the same tensor timed on each
rank's own clock from its barrier exit to its last call's return; the window's time is the
slowest rank's mean (elapsed / k, `ddnb.timing.time_collective`), and the reported time is
the median window (the upper middle one for an even --repeats). Also the algorithm
bandwidth algbw = size / time, and the bus bandwidth
busbw = algbw * 2(N-1)/N (nccl-tests' definition, doc/PERFORMANCE.md: the bytes each
rank's link carries in an optimal all-reduce, so busbw is comparable with the link's own
bandwidth whatever N is). The point-to-point bandwidth between ranks 0 and 1 (ping-pong at
the largest size) is printed as the ceiling. Horovod runs in a world of its own (see
`allreduce_benchmark`). `--fit` fits the alpha-beta model
(`ddnb.cost`) to point-to-point measurements only, ping-pong (one link alone) and
sendrecv (all links busy at once), measured beside each size's all-reduces so that both
see the same background load, plus a local add for gamma, and prints its prediction
beside each from-scratch algorithm's measured time (never fitted to the all-reduce
times it predicts).

Each function returns rows (`allreduce_rows`, `p2p_rows`, and `allreduce_benchmark`, which
runs both and the model as the command does); `allreduce_table` prints them, and
`ddnb.bench.__main__` turns a command line into these calls. Taught in
`notebooks/05_allreduce.ipynb` and `notebooks/12_scalability.ipynb`.
"""
from __future__ import annotations

import re

from ddnb.collectives import ALLREDUCES

FROM_SCRATCH = tuple(ALLREDUCES)  # ddnb's own all-reduces, by name
ALLREDUCE_ALGORITHMS = FROM_SCRATCH + ("torch", "horovod")
UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
         "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}
GB = 1e9  # bandwidths in GB/s = 1e9 bytes/s, as nccl-tests reports them


# ---------------------------------------------------------------- sizes and bandwidths
def parse_size(text: str) -> int:
    """"4KB" -> 4096. Units B, KB, MB, GB (powers of 1024; KiB, K, ... too); a float32
    buffer needs a positive multiple of 4 bytes."""
    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in UNITS:
        raise ValueError(f"cannot parse size {text!r}: expected a number and a unit "
                         f"(B, KB, MB, GB; KB = 1024 bytes), e.g. 4KB")
    size = int(m.group(1)) * UNITS[m.group(2).upper()]
    if size <= 0 or size % 4:
        raise ValueError(f"size {text!r} = {size} bytes: need a positive multiple of 4 bytes (float32)")
    return size


def parse_sizes(text: str, factor: int = 2) -> list[int]:
    """"4KB..64MB" -> 4 KB, 8 KB, ..., 64 MB (each size `factor` times the last, the
    upper end included when it is reached exactly); "4KB,1MB,16MB" -> those sizes."""
    if ".." in text:
        lo, _, hi = text.partition("..")
        lo, hi = parse_size(lo), parse_size(hi)
        if lo > hi or factor < 2:
            raise ValueError(f"size range {text!r}: need low <= high and factor >= 2, "
                             f"got low={lo}, high={hi}, factor={factor}")
        sizes = [lo]
        while sizes[-1] * factor <= hi:
            sizes.append(sizes[-1] * factor)
        return sizes
    return [parse_size(s) for s in text.split(",") if s.strip()] or [parse_size(text)]


def format_size(size: int) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return f"{size}B"


def busbw_factor(workers: int) -> float:
    """2(N-1)/N: busbw = algbw * this (nccl-tests, all-reduce)."""
    return 2 * (workers - 1) / workers


# ---------------------------------------------------------------- run on every rank
def _allreduce_op(algorithm: str, size: int):
    """The in-place all-reduce `algorithm` as op(tensor), built on this rank."""
    if algorithm == "torch":   # through the one traced layer (emulated: timed by its ring's messages)
        from ddnb.collectives import traced
        from ddnb.trace import Tracer

        quiet = Tracer(enabled=False)
        return lambda t: traced.all_reduce(t, tracer=quiet)
    if algorithm == "horovod":
        import horovod.torch as hvd

        name = f"ddnb.bench.allreduce.{size}"  # one fixed name per size, as a training loop has
        return lambda x: hvd.allreduce_(x, op=hvd.Sum, name=name)
    from ddnb.trace import Tracer

    fn, tracer = ALLREDUCES[algorithm], Tracer(enabled=False)
    return lambda x: fn(x, op="sum", tracer=tracer, check=False)


def _timed(measure, target_seconds: float, max_iters: int, repeats: int):
    """measure(iters) -> seconds per call, the same on every rank. Doubles `iters` until a
    probe takes ~1/10 of the target, then measures `repeats` windows of `iters` calls,
    ~target_seconds in all, and returns (the median window's time, iters): on a shared
    machine a burst of someone else's load spoils one window, not the result. In an
    emulated cluster, one call (after the warm-up): emulated time does not vary with load."""
    from ddnb.emulate import current

    if current() is not None:
        return measure(1), 1
    iters = 1
    while True:
        t = measure(iters)
        if t * iters >= target_seconds / 10 or iters >= max_iters:
            break
        iters *= 2
    iters = max(1, min(max_iters, round(target_seconds / repeats / max(t, 1e-9))))
    return sorted(measure(iters) for _ in range(repeats))[repeats // 2], iters


def rank_allreduce(algorithm: str, size: int, target_seconds: float, repeats: int = 3, max_iters: int = 10_000):
    """(seconds per all-reduce of `size` bytes, iterations): the slowest rank's mean over
    `iters` calls (`ddnb.timing.time_collective`), median of `repeats` such windows."""
    from ddnb.timing import time_collective

    op = _allreduce_op(algorithm, size)
    return _timed(lambda iters: time_collective(op, size // 4, iters=iters, warmup=1), target_seconds, max_iters,
                  repeats)


def rank_p2p(pattern: str, size: int, target_seconds: float, repeats: int = 3, max_iters: int = 10_000):
    """(seconds per message of `size` bytes, iterations): "pingpong" between ranks 0 and 1
    (one link alone), or "sendrecv" (every rank to rank+1 at once: all links busy)."""
    from ddnb.bench import links

    fn = {"pingpong": links.pingpong, "sendrecv": links.sendrecv}[pattern]
    return _timed(lambda iters: fn([size], iters=iters, warmup=1)[0], target_seconds, max_iters, repeats)


def rank_gamma(size: int) -> float:
    """Seconds per byte of a local add on this rank (all ranks at once, as in a collective)."""
    from ddnb.bench.links import measure_gamma

    return measure_gamma(size, iters=10)


def counting_overruns(fn, *args):
    """Run `fn(*args)` on this rank: (its result, the emulator's overruns during it), None
    for the count in real mode. An overrun means the real work took longer than its model,
    so the time measured across it is too slow (`ddnb.emulate.clock`)."""
    from ddnb.emulate import current

    em = current()
    before = em.overruns if em else 0
    out = fn(*args)
    return out, (em.overruns - before if em else None)


def _run_counted(world, fn, *args):
    """(rank 0's result of fn(*args), the overruns of all ranks during it or None)."""
    results = world.run(counting_overruns, fn, *args)
    counts = [c for _, c in results]
    return results[0][0], (None if counts[0] is None else sum(counts))


def world_threads(world) -> int:
    """The intra-op threads the ranks of `world` run with (the most any rank has):
    `ddnb.runtime.worker.threads_for`, cores / ranks on the host unless overridden."""
    return max(world.run(lambda: __import__("torch").get_num_threads()))


# ---------------------------------------------------------------- benchmarks -> rows
def allreduce_rows(world, sizes, algorithms=FROM_SCRATCH + ("torch",), target_seconds: float = 0.3,
                   repeats: int = 3, log=None) -> list[dict]:
    """One row per (size, algorithm): size (bytes), workers, algorithm, time (s, the
    slowest rank's mean, median of `repeats` windows; see `rank_allreduce`), iters, algbw
    and busbw (GB/s), threads (the ranks' intra-op threads, `world_threads`), ratio_vs_torch
    (busbw / torch's busbw at that size; None without torch)."""
    return timed_rows(world, sizes, algorithms, rank_allreduce, busbw_factor(world.n), target_seconds, repeats, log)


def timed_rows(world, sizes, algorithms, rank_fn, factor: float, target_seconds: float, repeats: int,
               log=None) -> list[dict]:
    """The rows of a collective's benchmark: per (size, algorithm), rank_fn(algorithm, size,
    target_seconds, repeats) -> (time, iters) on every rank of `world`; algbw = size / time,
    busbw = algbw * factor; ratio_vs_torch as `allreduce_rows` says."""
    rows, n, threads = [], world.n, world_threads(world)
    for size in sizes:
        for algorithm in algorithms:
            (t, iters), overruns = _run_counted(world, rank_fn, algorithm, size, target_seconds, repeats)
            algbw = size / t / GB
            rows.append({"size": size, "workers": n, "algorithm": algorithm, "time": t, "iters": iters,
                         "algbw": algbw, "busbw": algbw * factor, "threads": threads, "overruns": overruns})
            if log:
                log(f"{format_size(size):>6} {algorithm:<16} {t * 1e3:9.3f} ms  ({iters} iters)")
    return _add_ratios(rows)


def _add_ratios(rows: list[dict]) -> list[dict]:
    torch_bw = {r["size"]: r["busbw"] for r in rows if r["algorithm"] == "torch"}
    for r in rows:
        r["ratio_vs_torch"] = r["busbw"] / torch_bw[r["size"]] if r["size"] in torch_bw else None
    return rows


def p2p_rows(world, sizes, pattern: str = "pingpong", target_seconds: float = 0.2,
             repeats: int = 3) -> list[dict]:
    """One row per size: pattern, size, time (s per message, see `rank_p2p`),
    bw = size / time (GB/s) and overruns (emulated: all ranks' overruns while it was
    measured; None in real mode)."""
    if pattern not in ("pingpong", "sendrecv"):
        raise ValueError(f"pattern must be 'pingpong' or 'sendrecv', got {pattern!r}")
    rows = []
    for size in sizes:
        (t, _), overruns = _run_counted(world, rank_p2p, pattern, size, target_seconds, repeats)
        rows.append({"pattern": pattern, "size": size, "time": t, "bw": size / t / GB, "overruns": overruns})
    return rows


def message_sizes(size: int, workers: int) -> list[int]:
    """The message sizes an all-reduce of `size` bytes sends: a ring chunk (size/workers,
    rounded down to float32) and the whole vector (naive, tree); the model is fitted on
    point-to-point times at these sizes."""
    return sorted({max(4, size // workers // 4 * 4), size})


# The model's alpha, beta come from the measurement whose traffic matches the algorithm's:
# ring and halving-doubling keep every rank sending and receiving at once in every step
# (sendrecv); naive and tree move one or a few messages at a time (pingpong).
LINK_PATTERN = {"ring": "sendrecv", "halving_doubling": "sendrecv", "naive": "pingpong", "tree": "pingpong"}


def add_predictions(rows: list[dict], params: dict, gamma: float) -> None:
    """Add the alpha-beta-gamma model's time to the rows of the algorithms it covers:
    predicted_time with (alpha, beta) = params[LINK_PATTERN[algorithm]], and
    prediction_error = (predicted - measured) / measured; also pingpong_prediction_error,
    the textbook model's, with every algorithm on the ping-pong link."""
    from ddnb.cost import allreduce_time

    for r in rows:
        if r["algorithm"] in FROM_SCRATCH:
            args = (r["algorithm"], r["size"], r["workers"])
            alpha, beta = params[LINK_PATTERN[r["algorithm"]]]
            r["predicted_time"] = allreduce_time(*args, alpha, beta, gamma)
            r["prediction_error"] = (r["predicted_time"] - r["time"]) / r["time"]
            r["pingpong_prediction_error"] = (allreduce_time(*args, *params["pingpong"], gamma) - r["time"]) / r["time"]


def allreduce_benchmark(workers: int, sizes, algorithms=FROM_SCRATCH + ("torch",), target_seconds: float = 0.3,
                        repeats: int = 3, fit: bool = False, timeout: float = 300,
                        log=None, emulate=None) -> tuple[list[dict], dict]:
    """What `python -m ddnb.bench allreduce` measures, in worlds of its own: the rows of
    `allreduce_rows`, each with link_bw (GB/s, ping-pong at the largest size: the
    ceiling) and, with fit=True, the model's prediction (`add_predictions`); and the
    model: {"link": that ping-pong row, "p2p": {pattern: rows}, "alpha_beta": {pattern:
    (alpha, beta)}, "gamma": seconds per byte}. With fit=True the ping-pong and sendrecv
    at each size's `message_sizes` are measured right before that size's all-reduces.
    Every row has "overruns" (see `p2p_rows`).

    Horovod is measured last, in a second world: an initialized Horovod negotiates in a
    background thread every cycle even when idle (~70% of one core for 4 idle ranks,
    measured here), which would slow every other algorithm on a 2-core machine.

    emulate: a profile (`ddnb.emulate`): the same measurements in an emulated cluster;
    every time is then emulated seconds, each row says so ("emulated": the profile's
    name), torch's all-reduce keeps its values and is timed by the messages of ddnb's ring,
    and model["emulation"] says whether any operation overran its model. The model is
    still fitted to this run's own point-to-point measurements, never read from the
    profile: to the rows measured without an overrun (`fit_rows`) where at least two
    sizes of a pattern are, since an overran row is known to be too slow. Horovod is not emulated, so it is refused here."""
    from ddnb.cost import fit_alpha_beta
    from ddnb.emulate import summary
    from ddnb.testing import World

    if emulate is not None and "horovod" in algorithms:
        raise ValueError("emulate: Horovod is not emulated; leave it out of the algorithms")
    p2p, rows = {"pingpong": [], "sendrecv": []}, []
    with World(workers, timeout=timeout, emulate=emulate) as world:
        for size in sizes:
            if fit:
                for pattern in p2p:
                    p2p[pattern] += p2p_rows(world, message_sizes(size, workers), pattern, target_seconds, repeats)
            rows += allreduce_rows(world, [size], [a for a in algorithms if a != "horovod"], target_seconds,
                                   repeats, log=log)
        if not fit:
            p2p = {"pingpong": p2p_rows(world, [max(sizes)], "pingpong", target_seconds, repeats)}
        gamma = max(world.run(rank_gamma, min(max(sizes), 64 << 20))) if fit else None
        emulation = summary(world.emulation_reports()) if world.emulate else None
        profile = world.emulate.name if world.emulate else None
    if "horovod" in algorithms:
        with World(workers, timeout=timeout, horovod=True) as world:
            rows += allreduce_rows(world, sizes, ["horovod"], target_seconds, repeats, log=log)
        order = {a: i for i, a in enumerate(algorithms)}
        rows.sort(key=lambda r: (r["size"], order[r["algorithm"]]))
    model = {"link": max(p2p["pingpong"], key=lambda r: r["size"]), "p2p": p2p, "emulation": emulation}
    for r in _add_ratios(rows):
        r["link_bw"] = model["link"]["bw"]
        r["emulated"] = profile
    if fit:
        fitted = {pattern: fit_rows(pr) for pattern, pr in p2p.items()}
        model["alpha_beta"] = {pattern: fit_alpha_beta([r["size"] for r in pr], [r["time"] for r in pr])
                               for pattern, pr in fitted.items()}
        model["fit_sizes"] = {pattern: [r["size"] for r in pr] for pattern, pr in fitted.items()}
        model["gamma"] = gamma
        add_predictions(rows, model["alpha_beta"], gamma)
    return rows, model


def fit_rows(rows: list[dict]) -> list[dict]:
    """The point-to-point rows the model is fitted to: those measured without an overrun
    (emulated mode) if they cover at least two sizes, else all of them (real mode: all)."""
    clean = [r for r in rows if not r.get("overruns")]
    return clean if len({r["size"] for r in clean}) >= 2 else rows


# ---------------------------------------------------------------- table
def format_time(t: float) -> str:
    return f"{t * 1e6:.1f} us" if t < 1e-3 else f"{t * 1e3:.2f} ms"


def allreduce_table(rows: list[dict]) -> str:
    fit = any("predicted_time" in r for r in rows)
    head = f"{'size':>6}  {'algorithm':<16} {'time':>10} {'algbw GB/s':>10} {'busbw GB/s':>10} {'vs torch':>8}"
    lines = [head + (f" {'model':>10} {'error':>7} {'pp error':>8}" if fit else "")]
    for i, r in enumerate(rows):
        if i and r["size"] != rows[i - 1]["size"]:
            lines.append("")
        ratio = "" if r["ratio_vs_torch"] is None else f"{r['ratio_vs_torch']:.2f}"
        line = (f"{format_size(r['size']):>6}  {r['algorithm']:<16} {format_time(r['time']):>10} "
                f"{r['algbw']:>10.3f} {r['busbw']:>10.3f} {ratio:>8}")
        if "predicted_time" in r:
            line += (f" {format_time(r['predicted_time']):>10} {r['prediction_error']:>+7.0%}"
                     f" {r['pingpong_prediction_error']:>+8.0%}")
        lines.append(line)
    return "\n".join(lines)
