"""ddnb.collectives: every all-reduce against torch.distributed.all_reduce on the same
inputs, for world sizes 1-6, every op and dtype, sizes 0, 1, N-1, N+1 and large; reduce,
broadcast, reduce-scatter and all-gather; the in-place contract; bad input (raised on
every rank, never a hang); and the bytes and peers the tracer records.

Each test is one `World.run` that loops over many cases inside the ranks and returns the
mismatches, so the whole file stays a few dozen seconds on 2 cores.
"""
import hashlib

import pytest
import torch
import torch.distributed as dist

from ddnb.collectives import (ALLREDUCES, OPS, broadcast, chunk_bounds, reduce, ring_allgather,
                              ring_reduce_scatter)
from ddnb.trace import Tracer, bytes_sent, match_messages

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64]
TORCH_OP = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "max": dist.ReduceOp.MAX,
            "min": dist.ReduceOp.MIN, "product": dist.ReduceOp.PRODUCT}


def make_input(rank, seed, shape, dtype, op):
    """Rank `rank`'s input of a case: seeded, so any rank can rebuild any other's."""
    g = torch.Generator().manual_seed(7919 * seed + rank)
    if dtype.is_floating_point:   # products of values near 1 stay finite in fp16
        x = torch.rand(shape, generator=g, dtype=torch.float64) + 0.5 if op == "product" else \
            torch.randn(shape, generator=g, dtype=torch.float64) * 4
        return x.to(dtype)
    lo, hi = (-3, 4) if op == "product" else (-1000, 1000)
    return torch.randint(lo, hi, shape, generator=g, dtype=dtype)


def digest(t):
    return hashlib.sha1(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


def error_bound(inputs, ref, op):
    """How far two correct float all-reduces that add or multiply in different orders may
    differ: each is within (N-1)·eps·Σ|x_r| of the exact sum (the standard bound for
    recursive summation, Higham 2002, Sec. 4.2), so they are within twice that of each
    other. max and min round nothing: they must agree exactly."""
    n, eps = len(inputs), torch.finfo(ref.dtype).eps
    if op in ("max", "min") or n == 1:
        return torch.zeros(ref.shape, dtype=torch.float64)
    if op == "product":
        return 2 * n * eps * ref.double().abs()
    bound = 2 * (n - 1) * eps * sum(x.double().abs() for x in inputs)
    return bound / n + 2 * eps * ref.double().abs() if op == "avg" else bound


def compare(got, ref, bound=None):
    """None if got matches ref (exactly for integers, within `bound` for floats), else why."""
    if got.dtype != ref.dtype or got.shape != ref.shape:
        return f"got {got.dtype} {tuple(got.shape)}, expected {ref.dtype} {tuple(ref.shape)}"
    if not got.dtype.is_floating_point or bound is None:
        return None if torch.equal(got, ref) else f"max |diff| {(got.double() - ref.double()).abs().max().item()}"
    excess = (got.double() - ref.double()).abs() - bound
    if excess.numel() and excess.max() > 0:
        i = int(excess.flatten().argmax())
        return f"element {i}: got {got.flatten()[i].item()}, torch {ref.flatten()[i].item()}, " \
               f"allowed difference {bound.flatten()[i].item():.3g}"
    return None


def sweep(cases):
    """On every rank: run each (algorithm, dtype, op, shape, kwargs) case and compare it with
    dist.all_reduce on the same input. Returns (mismatches, digests of the results)."""
    rank, n, refs, bad, digests = dist.get_rank(), dist.get_world_size(), {}, [], []
    for algo, dtype, op, shape, kwargs in cases:
        key = (dtype, op, shape)
        if key not in refs:   # (my input, torch's result, allowed difference)
            inputs = [make_input(r, len(refs), shape, dtype, op) for r in range(n)]
            ref = inputs[rank].clone()
            dist.all_reduce(ref, op=TORCH_OP[op])
            refs[key] = inputs[rank], ref, error_bound(inputs, ref, op) if dtype.is_floating_point else None
        mine, ref, bound = refs[key]
        x = mine.clone()
        out = ALLREDUCES[algo](x, op=op, **kwargs)
        why = "did not return its input" if out is not x else compare(x, ref, bound)
        if why:
            bad.append(f"rank {rank} {algo} {dtype} {op} shape={shape} {kwargs}: {why}")
        digests.append(digest(x))
    return bad, digests


def sweep_cases(n):
    """The full cross: every algorithm x dtype x op x size 0, 1, N-1, N+1 and large
    (100_003 elements, not divisible by any N of 2-6), with 2-D and 0-dim tensors for a
    few (dtype, op) pairs, many pipeline segments per ring chunk, and one 4 MB tensor per
    algorithm."""
    cases = []
    for algo in ALLREDUCES:
        for dtype in DTYPES:
            for op in OPS:
                if op == "avg" and not dtype.is_floating_point:
                    continue   # torch refuses it too
                for numel in sorted({0, 1, max(n - 1, 1), n + 1, 100_003}):
                    cases.append((algo, dtype, op, (numel,), {}))
        for shape in [(3, 5), ()]:
            for dtype, op in [(torch.float32, "sum"), (torch.int64, "max"), (torch.bfloat16, "avg")]:
                cases.append((algo, dtype, op, shape, {}))
        cases.append((algo, torch.float32, "sum", ((1 << 20) + 5,), {}))   # 4 MiB + 20 B
    for dtype in [torch.float16, torch.int64, torch.float64]:   # many pipeline segments per chunk
        for shape, segment_bytes in [((n + 1,), 8), ((200 * n + 3,), 24), ((1000 * n + 3,), 1000)]:
            cases.append(("ring", dtype, "sum", shape, {"segment_bytes": segment_bytes}))
    cases.append(("ring", torch.float32, "product", (4096 * n,), {"segment_bytes": 1000}))
    return cases


def test_sweep_is_the_full_cross():
    """Guard the grid itself: dropping a dtype, op, size or algorithm fails here."""
    for n in (1, 4, 6):
        cases = sweep_cases(n)
        seen = {(a, d, o, s) for a, d, o, s, _ in cases}
        for algo in ALLREDUCES:
            for dtype in DTYPES:
                for op in OPS:
                    for numel in (0, 1, max(n - 1, 1), n + 1, 100_003):
                        assert (algo, dtype, op, (numel,)) in seen or (op == "avg" and not dtype.is_floating_point)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6])
def test_allreduce_matches_torch(world, n):
    cases = sweep_cases(n)
    results = world(n).run(sweep, cases)
    bad = [b for mismatches, _ in results for b in mismatches]
    assert not bad, f"{len(bad)} mismatches, first: " + "\n".join(bad[:10])
    for i, case in enumerate(cases):   # every rank ends with the same bits
        assert len({digests[i] for _, digests in results}) == 1, f"ranks disagree on {case}"


def test_chunk_bounds():
    assert chunk_bounds(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert chunk_bounds(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]
    assert chunk_bounds(0, 3) == [(0, 0)] * 3
    assert chunk_bounds(7, 1) == [(0, 7)]
    for numel in range(12):
        for n in range(1, 6):
            sizes = [b - a for a, b in chunk_bounds(numel, n)]
            assert sizes == [len(c) for c in torch.arange(numel).tensor_split(n)]
    with pytest.raises(ValueError, match="numel=-1"):
        chunk_bounds(-1, 2)


def reduce_broadcast_scatter_gather():
    rank, n, bad = dist.get_rank(), dist.get_world_size(), []
    for seed, numel in enumerate([0, 1, n + 1, 1001]):
        for op in ["sum", "max", "avg"]:
            inputs = [make_input(r, seed, (numel,), torch.float64, op) for r in range(n)]
            x, ref = inputs[rank], inputs[rank].clone()
            dist.all_reduce(ref, op=TORCH_OP[op])
            bound = error_bound(inputs, ref, op)
            for dst in range(n):
                y = x.clone()
                reduce(y, dst=dst, op=op)
                why = compare(y, ref, bound) if rank == dst else compare(y, x)
                if why:
                    bad.append(f"reduce dst={dst} {op} numel={numel}: {why}")
            for src in range(n):
                y = x.clone()
                broadcast(y, src=src)
                if not torch.equal(y, inputs[src]):
                    bad.append(f"broadcast src={src} numel={numel}")
            y = x.clone()
            start, stop = chunk_bounds(numel, n)[rank]
            chunk = ring_reduce_scatter(y, op=op, segment_bytes=16)
            why = compare(chunk, ref[start:stop], bound[start:stop])
            if why:
                bad.append(f"ring_reduce_scatter {op} numel={numel}: {why}")
            if numel and chunk.data_ptr() != y[start:stop].data_ptr():
                bad.append("ring_reduce_scatter did not return a view into its input")
            why = "did not return its input" if ring_allgather(y, segment_bytes=16) is not y else \
                compare(y, ref, bound)
            if why:
                bad.append(f"reduce_scatter + allgather {op} numel={numel}: {why}")
        mine = torch.full((numel,), -1, dtype=torch.int64)        # all-gather of rank-owned chunks
        for c, (a, b) in enumerate(chunk_bounds(numel, n)):
            if c == rank:
                mine[a:b] = torch.arange(a, b) * 10 + c
        expected = torch.cat([torch.arange(a, b) * 10 + c for c, (a, b) in enumerate(chunk_bounds(numel, n))])
        if not torch.equal(ring_allgather(mine), expected):
            bad.append(f"ring_allgather numel={numel}: {mine.tolist()[:12]} != {expected.tolist()[:12]}")
    return bad


@pytest.mark.parametrize("n", [1, 4, 5])
def test_reduce_broadcast_reduce_scatter_allgather(world, n):
    bad = [b for r in world(n).run(reduce_broadcast_scatter_gather) for b in r]
    assert not bad, "\n".join(bad[:10])


def in_place_contract():
    rank, n, bad = dist.get_rank(), dist.get_world_size(), []
    for algo, fn in ALLREDUCES.items():
        base = (torch.arange(12.0) + rank).reshape(3, 4)
        expected = sum((torch.arange(12.0) + r).reshape(3, 4) for r in range(n))
        view = base.t()                                            # (4, 3), not contiguous
        if fn(view) is not view or not torch.equal(base, expected):
            bad.append(f"{algo}: non-contiguous view {base.tolist()}")
        strided = torch.zeros(10)
        strided[::2] = rank + 1.0                                  # every other element
        fn(strided[::2], op=dist.ReduceOp.MAX)
        if strided.tolist() != [float(n) if i % 2 == 0 else 0.0 for i in range(10)]:
            bad.append(f"{algo}: strided slice {strided.tolist()}")
        scalar = torch.tensor(float(rank), requires_grad=True)      # 0-dim leaf, like a loss
        if fn(scalar, op=dist.ReduceOp.AVG).item() != (n - 1) / 2:
            bad.append(f"{algo}: 0-dim avg {scalar.item()}")
        t = torch.tensor([rank + 2], dtype=torch.int64)
        if fn(t, op=dist.ReduceOp.PRODUCT).item() != torch.arange(2, n + 2).prod().item():
            bad.append(f"{algo}: ReduceOp.PRODUCT {t.item()}")
        if fn(torch.tensor([1.0]), op="SUM").item() != n:
            bad.append(f"{algo}: op name in capitals")
    return bad


@pytest.mark.parametrize("n", [1, 3])
def test_in_place_non_contiguous_and_reduce_op_enum(world, n):
    bad = [b for r in world(n).run(in_place_contract) for b in r]
    assert not bad, "\n".join(bad)


def expect_errors(calls):
    """Run each (name, thunk) and return (name, exception type, message) per call."""
    out = []
    for name, thunk in calls:
        try:
            thunk()
            out.append((name, None, ""))
        except Exception as e:  # noqa: BLE001
            out.append((name, type(e).__name__, str(e)))
    return out


def bad_local_input():
    tracer = Tracer()
    calls = []
    for algo, fn in ALLREDUCES.items():
        calls += [(f"{algo} op=mean unchecked", lambda fn=fn: fn(torch.ones(3), op="mean", tracer=tracer, check=False)),
                  (f"{algo} not a tensor", lambda fn=fn: fn([1.0, 2.0], tracer=tracer, check=False))]
    calls += [("ring segment_bytes=0", lambda: ALLREDUCES["ring"](torch.ones(3), segment_bytes=0, tracer=tracer,
                                                                   check=False)),
              ("ring depth=0", lambda: ALLREDUCES["ring"](torch.ones(3), depth=0, tracer=tracer, check=False)),
              ("reduce dst", lambda: reduce(torch.ones(3), dst=dist.get_world_size(), tracer=tracer, check=False)),
              ("broadcast src", lambda: broadcast(torch.ones(3), src=-1, tracer=tracer, check=False))]
    errors = expect_errors(calls)
    messages = len(tracer.take())        # none of these may send anything
    for algo, fn in ALLREDUCES.items():  # consistent on all ranks: caught after the check
        errors += expect_errors([(f"{algo} int avg", lambda fn=fn: fn(torch.ones(3, dtype=torch.int64), op="avg")),
                                 (f"{algo} op=mean", lambda fn=fn: fn(torch.ones(3), op="mean")),
                                 (f"{algo} BAND", lambda fn=fn: fn(torch.ones(3), op=dist.ReduceOp.BAND)),
                                 (f"{algo} complex", lambda fn=fn: fn(torch.ones(3, dtype=torch.complex64)))])
    return errors, messages


def test_bad_input_raises_before_any_message(world):
    for errors, messages in world(2).run(bad_local_input):
        assert messages == 0
        for name, kind, msg in errors:
            assert kind is not None, f"{name} did not raise"
            if "op=mean" in name or "BAND" in name:
                assert kind == "ValueError" and "'sum', 'avg', 'max', 'min', 'product'" in msg, (name, msg)
            elif "not a tensor" in name or "complex" in name:
                assert kind == "TypeError" and ("list" in msg or "complex64" in msg), (name, msg)
            elif "segment_bytes=0" in name or "depth=0" in name:
                assert kind == "ValueError" and "segment_bytes >= 1 and depth >= 1" in msg, (name, msg)
            elif "int avg" in name:
                assert kind == "ValueError" and "floating-point" in msg and "int64" in msg, (name, msg)
            else:
                assert kind == "ValueError" and "world_size 2" in msg, (name, msg)


def mismatched_calls():
    rank = dist.get_rank()
    shape = (5,) if rank == 1 else (4, 3)
    dtype = torch.float64 if rank == 2 else torch.float32
    calls = []
    for algo, fn in ALLREDUCES.items():
        calls += [(f"{algo} shape", lambda fn=fn: fn(torch.ones(shape))),
                  (f"{algo} dtype", lambda fn=fn: fn(torch.ones(4, dtype=dtype))),
                  (f"{algo} op", lambda fn=fn: fn(torch.ones(4), op="max" if rank == 0 else "sum")),
                  (f"{algo} bad op on one rank", lambda fn=fn: fn(torch.ones(4), op="mean" if rank == 1 else "sum")),
                  (f"{algo} complex on one rank",
                   lambda fn=fn: fn(torch.ones(4, dtype=torch.complex64 if rank == 1 else torch.float32)))]
    other = ALLREDUCES["ring"] if rank == 0 else ALLREDUCES["tree"]
    calls += [("different algorithms", lambda: other(torch.ones(4))),
              ("reduce dst", lambda: reduce(torch.ones(4), dst=rank)),
              ("broadcast shape", lambda: broadcast(torch.ones(shape))),
              ("reduce_scatter", lambda: ring_reduce_scatter(torch.ones(shape))),
              ("allgather", lambda: ring_allgather(torch.ones(shape))),
              ("ring segment_bytes", lambda: ALLREDUCES["ring"](torch.ones(4), segment_bytes=64 if rank else 128))]
    errors = expect_errors(calls)
    t = torch.ones(4)                  # the group is still in step afterwards
    ALLREDUCES["ring"](t)
    return errors, t.tolist()


def test_mismatched_inputs_raise_on_every_rank(world):
    results = world(3).run(mismatched_calls)
    for rank, (errors, after) in enumerate(results):
        assert after == [3.0] * 4
        for name, kind, msg in errors:
            assert kind == "ValueError", f"rank {rank}: {name} raised {kind}: {msg}"
            assert f"on rank {rank}" in msg and "ranks [" in msg, msg
        msgs = {name: msg for name, _, msg in errors}
        assert "ranks [0, 2]: ring_allreduce(shape=(4, 3), dtype=float32, op='sum', segment_bytes=4194304); " \
               "ranks [1]: ring_allreduce(shape=(5,), dtype=float32, op='sum', segment_bytes=4194304)" \
               in msgs["ring shape"]
        assert "ranks [2]: naive_allreduce(shape=(4,), dtype=float64, op='sum')" in msgs["naive dtype"]
        assert "ranks [0]: tree_allreduce(shape=(4,), dtype=float32, op='max')" in msgs["tree op"]
        assert "dtype=complex64" in msgs["halving_doubling complex on one rank"]
        assert "ranks [1]: ring_allreduce(shape=(4,), dtype=float32, op=<unsupported>" in msgs["ring bad op on one rank"]
        assert "ranks [0]: ring_allreduce" in msgs["different algorithms"]
        assert "ranks [1, 2]: tree_allreduce" in msgs["different algorithms"]
        assert "root=0" in msgs["reduce dst"] and "root=2" in msgs["reduce dst"]
        assert "ranks [0]: ring_allreduce(shape=(4,), dtype=float32, op='sum', segment_bytes=128); " \
               "ranks [1, 2]: ring_allreduce(shape=(4,), dtype=float32, op='sum', segment_bytes=64)" \
               in msgs["ring segment_bytes"]


def traced(algo, numel, segment_bytes):
    tracer = Tracer()
    kwargs = {"segment_bytes": segment_bytes} if algo == "ring" else {}
    ALLREDUCES[algo](torch.ones(numel), tracer=tracer, **kwargs)
    return tracer.take()


@pytest.mark.parametrize("n", [4, 5])
def test_trace_bytes_and_peers(world, n):
    numel = 240 * n                               # divisible by N
    S = numel * 4                                 # bytes of the float32 tensor
    w = world(n)
    for algo in ALLREDUCES:
        per_rank = w.run(traced, algo, numel, 128)
        events = [e for evs in per_rank for e in evs]
        data = [e for e in events if e["name"] != "check"]
        checks = [e for e in events if e["name"] == "check"]
        assert len(match_messages(events)) == sum(e["kind"] == "send" for e in events)
        assert all(s["nbytes"] == r["nbytes"] for s, r in match_messages(events))
        assert sorted((e["rank"], e["kind"]) for e in checks if e["peer"] != 0) == \
               sorted([(0, "recv")] * (n - 1) + [(0, "send")] * (n - 1))
        sent = bytes_sent(data, n)
        received = [sum(e["nbytes"] for e in data if e["kind"] == "recv" and e["rank"] == r) for r in range(n)]
        reduced = [sum(e["nbytes"] for e in data if e["kind"] == "compute" and e["name"] == "reduce"
                       and e["rank"] == r) for r in range(n)]
        if algo == "ring":
            assert sent == received == [2 * (n - 1) * S // n] * n
            assert reduced == [(n - 1) * S // n] * n
            assert all(e["peer"] == (e["rank"] + 1) % n for e in data if e["kind"] == "send")
            assert all(e["peer"] == (e["rank"] - 1) % n for e in data if e["kind"] == "recv")
            assert all(e["nbytes"] <= 128 for e in data if e["kind"] in ("send", "recv"))
        elif algo == "naive":
            assert received == [(n - 1) * S] + [S] * (n - 1) and sent == received
            assert reduced == [(n - 1) * S] + [0] * (n - 1)
            assert all((e["rank"] == 0) != (e["peer"] == 0) for e in data if e["kind"] in ("send", "recv"))
        elif algo == "tree":
            assert received[0] == (n - 1).bit_length() * S and sent[0] == (n - 1).bit_length() * S
            assert sum(sent) == 2 * (n - 1) * S
        elif algo == "halving_doubling" and n == 4:
            assert sent == received == [2 * (n - 1) * S // n] * n
            partners = {(e["rank"], e["peer"]) for e in data if e["kind"] == "send"}
            assert partners == {(r, r ^ d) for r in range(n) for d in (1, 2)}
        elif algo == "halving_doubling":   # 5 = 4 + 1: rank 1 folds into rank 0, sits out, gets S back
            core = 2 * 3 * S // 4          # what each of the 4 core ranks sends
            assert sent == [core + S, S] + [core] * (n - 2) and received == [core + S, S] + [core] * (n - 2)
