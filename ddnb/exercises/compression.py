"""Checkers for the compression chapter (14): implement top-k with error feedback, predict
PowerSGD's bytes for a layer, predict gradient accumulation's all-reduce count. Each runs
on real processes and compares with ddnb.compression's measurement. While the learner's
top-k runs, dist.all_gather is the one collective allowed (and what it is handed is
counted: about 2k entries, not the dense gradient), and ddnb's own top-k is refused
(`ddnb.exercises.guard`).
Taught in `notebooks/14_precision_compression.ipynb`.
"""
from __future__ import annotations

import math

import torch

from ddnb._checks import Checks, is_number
from ddnb.exercises import worlds
from ddnb.exercises.core import compare, passed, run_on_ranks
from ddnb.exercises.guard import ship

STEPS = 3


def _grad(rank: int, step: int, numel: int) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(1000 * step + rank))


WHY = "all-gather every rank's (indices, values) with dist.all_gather, that is the exercise"


def _run_topk(blob, numel: int, k: int):
    """fn(grad, error, k) -> (mean, new_error), STEPS steps on this rank, each with the
    all-gathers allowed and every other collective and ddnb's top-k refused; per step
    (mean, error, elements handed to the all-gathers, elements sent point to point)."""
    import torch.distributed as dist

    from ddnb.exercises.guard import ALL_GATHERS, land, refuse_collectives

    error, out = torch.zeros(numel), []
    for t in range(STEPS):
        with refuse_collectives(allow=ALL_GATHERS, why=WHY) as wire:
            mean, error = land(blob)(_grad(dist.get_rank(), t, numel), error.clone(), k)
        out.append((mean.clone(), error.clone(), sum(wire.handed.values()), wire.sent_bytes // 4))
    return out


def _reference_topk(n: int, numel: int, k: int, feedback: bool = True):
    """[(mean, [error per rank])] per step, one process for n ranks."""
    errors, out = [torch.zeros(numel) for _ in range(n)], []
    for t in range(STEPS):
        total = torch.zeros(numel)
        for r in range(n):
            a = _grad(r, t, numel) + (errors[r] if feedback else 0)
            idx = a.abs().topk(k).indices
            total[idx] += a[idx]
            errors[r] = a.clone()
            errors[r][idx] = 0
        out.append((total / n, [e.clone() for e in errors]))
    return out


def _diagnose_topk(got, ref, ref_plain, rank, n, step, a=None) -> str:
    """What a wrong top-k step usually means; a: this rank's grad + error (dense)."""
    mean, err = got
    if a is not None and torch.allclose(mean, a):
        return (f"rank {rank} returned its own grad + error, dense: select its k largest |entries|, all-gather "
                f"every rank's, and return their mean")
    if torch.allclose(mean, ref[0] * n):
        return "the result is N times the mean: divide the sum of the gathered values by the world size"
    if step > 0 and torch.allclose(mean, ref_plain[0]):
        return ("step 1 equals top-k *without* error feedback: add the error to the gradient before selecting "
                "(a = grad + error)")
    if torch.allclose(mean, ref[0]) and not torch.allclose(err, ref[1][rank]):
        if torch.count_nonzero(err) == 0:
            return "the error is zero: keep what was *not* sent (a with the sent entries set to 0)"
        return "the error should be a − (what was sent): the sent entries zeroed, the others kept"
    if torch.count_nonzero(mean) <= torch.count_nonzero(ref[0]) // n + 1:
        return ("only this rank's entries are in the result: all-gather every rank's (indices, values) and "
                "add them all in (each rank's indices differ, so they cannot be all-reduced)")
    return "the selected entries differ: pick the k largest |a| (magnitude, torch.topk(a.abs(), k)), not the largest a"


def diagnose_topk_bytes(handed: int, p2p: int, n: int, numel: int, k: int) -> str | None:
    """The message when a rank did not send about 2k entries (k indices, k values), else None."""
    if handed == 0 and p2p == 0:
        return ("it handed nothing to dist.all_gather: all-gather the k indices and the k values (a collective "
                "run another way is not seen)")
    if handed > 2 * k:
        dense = "; that is the dense tensor: send only the k selected entries" if handed >= numel else ""
        return (f"it handed {handed} elements to the all-gathers; top-k sends k indices and k values, 2k = "
                f"{2 * k}{dense}")
    if p2p > 2 * k * (n - 1):
        return (f"it sent {p2p} elements point to point; k indices and k values to each of the N-1 others are "
                f"2k·(N-1) = {2 * k * (n - 1)}")
    return None


def check_topk_error_feedback(fn, world_size: int | None = None, numel: int = 40, k: int = 4, timeout: float = 30,
                              world_sizes=(3, 4)) -> str:
    """Run `fn(grad, error, k) -> (mean, new_error)` on real processes for 3 steps (each
    rank's error carried from step to step), on two world sizes (`world_sizes`, or
    `world_size` and a second one, `ddnb.exercises.worlds`), and compare with top-k with
    error feedback (Stich et al. 2018): the mean over the ranks of every rank's k
    largest-magnitude entries of grad + error, and the new error = grad + error with
    those entries zeroed. fn all-gathers the (index, value) pairs: dist.all_gather (and
    all_gather_into_tensor) are allowed and what they are handed is counted, at most
    2k elements per rank and step (not the dense gradient); every other collective and
    ddnb's own top-k (ddnb.compression.topk) are refused (`ddnb.exercises.guard`)."""
    with Checks("check_topk_error_feedback") as check:
        check.rule(callable(fn), f"fn={fn!r}: need a function fn(grad, error, k) -> (mean, new_error)")
        ns = worlds.world_sizes(check, world_size, world_sizes, min_world=2)
        if check.integer("numel", numel, min=1):
            check.integer("k", k, min=1, max=numel)
    blob = ship(fn)
    for n in ns:
        got = run_on_ranks(_run_topk, n, blob, numel, k, what=getattr(fn, "__name__", "fn"), timeout=timeout)
        ref, plain = _reference_topk(n, numel, k), _reference_topk(n, numel, k, feedback=False)
        for rank, steps in enumerate(got):
            for t, (mean, err, _, _) in enumerate(steps):
                ok = torch.allclose(mean, ref[t][0], atol=1e-6) and torch.allclose(err, ref[t][1][rank], atol=1e-6)
                a = _grad(rank, t, numel) + (ref[t - 1][1][rank] if t else 0)
                hint = "" if ok else _diagnose_topk((mean, err), (ref[t][0], ref[t][1]), plain[t], rank, n, t, a)
                compare(mean, ref[t][0], rank=rank, name=f"{n} ranks, step {t}: the mean", hint=hint, atol=1e-6)
                compare(err, ref[t][1][rank], rank=rank, name=f"{n} ranks, step {t}: the new error", hint=hint,
                        atol=1e-6)
        for rank, steps in enumerate(got):
            for t, (_, _, handed, p2p) in enumerate(steps):
                wrong = diagnose_topk_bytes(handed, p2p, n, numel, k)
                if wrong:
                    raise AssertionError(f"{n} ranks, step {t}: the values are right, but rank {rank}: {wrong}")
    return passed("check_topk_error_feedback", f"{STEPS} steps on {worlds.in_words(ns)}, k={k} of {numel}, "
                                               f"2k entries all-gathered per rank")


def _measure_powersgd(shape, rank: int) -> int:
    """Bytes this rank hands to the collectives in one compressed PowerSGD step of one
    gradient of `shape` (traced)."""
    from ddnb.compression import PowerSGDState, powersgd_hook
    from ddnb.compression.comm import Bucket, bytes_per_step
    from ddnb.trace import Tracer

    tracer = Tracer()
    state = PowerSGDState(None, matrix_approximation_rank=rank, start_powerSGD_iter=2, tracer=tracer)
    state.iter = 2                                                    # past the plain steps
    g = torch.randn(shape)
    powersgd_hook(state, Bucket(0, g.view(-1), [g])).wait()
    return bytes_per_step(tracer.take())[2]


def check_powersgd_bytes(answer, shape=(512, 256), rank: int = 4, timeout: float = 30) -> str:
    """Your prediction: bytes one rank hands to the all-reduces in one compressed PowerSGD
    step of a (n, m) gradient at rank r; measured from the trace on 2 processes."""
    with Checks("check_powersgd_bytes") as check:
        check.rule(is_number(answer), f"answer={answer!r}: need a number of bytes")
    measured = run_on_ranks(_measure_powersgd, 2, tuple(shape), rank, what="PowerSGD", timeout=timeout)[0]
    n, m = shape[0], math.prod(shape[1:])
    if answer != measured:
        hints = {n * m * 4: "that is the uncompressed gradient: PowerSGD sends P (n, r) and Q (m, r) instead",
                 (n + m) * rank: "that is elements: each is a 4-byte float",
                 n * rank * 4: "that is P alone: Q (m, r) is all-reduced too",
                 m * rank * 4: "that is Q alone: P (n, r) is all-reduced too",
                 n * m * rank * 4: "P and Q are thin: n·r and m·r elements, not n·m·r"}
        raise AssertionError(f"predicted {answer} bytes, measured {measured} for a {shape} gradient at rank {rank}. "
                             + hints.get(answer, "count the elements of P = M Q and of Q = Mᵀ P, times 4 bytes"))
    return passed("check_powersgd_bytes", f"{measured} bytes = 4·(n + m)·r for {tuple(shape)} at rank {rank} "
                                          f"({n * m * 4 / measured:.1f}x fewer than uncompressed)")


def _measure_calls(steps: int, per_rank: int, k: int) -> int:
    from ddnb.compression.train import train_compressed

    out = train_compressed("none", steps=steps, per_rank=per_rank, accumulate=k, hidden=(16,))
    return sum(out["calls"].values())


def check_accumulation_calls(answer, samples: int = 192, per_rank: int = 8, k: int = 4, timeout: float = 60) -> str:
    """Your prediction: all-reduce calls (one bucket) to train on `samples` samples per rank
    in micro-batches of `per_rank`, synchronizing every `k` (DDP's no_sync); measured."""
    with Checks("check_accumulation_calls") as check:
        check.rule(is_number(answer), f"answer={answer!r}: need a number of calls")
        check.positive_ints(samples=samples, per_rank=per_rank, k=k)
        check.rule(samples % (per_rank * k) == 0, f"samples={samples} must be a multiple of per_rank·k")
    measured = run_on_ranks(_measure_calls, 2, samples // (per_rank * k), per_rank, k, what="accumulation",
                            timeout=timeout)[0]
    if answer != measured:
        micro = samples // per_rank
        hints = {micro: "that is one call per micro-batch: under no_sync the first k-1 backward passes send nothing",
                 micro * k: "one call per k micro-batches, not k per micro-batch",
                 samples: "calls are counted per synchronized step, not per sample"}
        raise AssertionError(f"predicted {answer}, measured {measured} all-reduce calls. "
                             + hints.get(answer, "count the optimizer steps: samples / (per_rank · k)"))
    return passed("check_accumulation_calls", f"{measured} calls = samples / (per_rank·k) = "
                                              f"{samples} / ({per_rank}·{k}), {k}x fewer than without accumulation")
