"""ddnb.collectives.all_to_all: pairwise and Bruck against torch.distributed.all_to_all_single
on the same inputs (exactly: nothing is computed, only moved), for world sizes 1-6,
float32/float64/int64, rows of any shape, equal and uneven splits with empty chunks,
non-contiguous tensors; the bytes and peers the tracer records against ddnb.cost's
model; bad input (one ValueError listing every problem, before any data message, on
every rank); the cost model by hand; the bench command's argument errors before any
process starts, and a tiny real run of its rows.

Every multi-process test runs on the session's `world(6)` (tests/conftest.py): the world
sizes 1-5 are process groups of some of its ranks (`dist.new_group`, made once per rank
process), so group ranks differ from global ranks, as in a real job.
"""
import json
import math

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from ddnb.bench import alltoall as bench
from ddnb.bench.__main__ import main
from ddnb.collectives import ALL_TO_ALLS, all_to_all, bruck_all_to_all
from ddnb.collectives.all_to_all import problems
from ddnb.cost import alltoall_bytes_per_rank, alltoall_time
from ddnb.trace import Tracer, match_messages

WORLD = 6
MEMBERS = [[2], [0, 1], [1, 3, 4], [0, 1, 2, 3], [0, 2, 3, 4, 5], list(range(WORLD))]  # sizes 1-6
DTYPES = [torch.float32, torch.float64, torch.int64]
_groups: dict = {}   # per rank process: the groups of MEMBERS, made once


def groups():
    """[(group or None, group size)] for the groups this rank is a member of. Every rank
    of the world calls dist.new_group for every group, in the same order, the first time."""
    if not _groups:
        for ranks in MEMBERS[:-1]:
            _groups[tuple(ranks)] = dist.new_group(ranks)
        _groups[tuple(MEMBERS[-1])] = None   # the default group
    me = dist.get_rank()
    return [(_groups[tuple(r)], len(r)) for r in MEMBERS if me in r]


def split_matrix(n, seed, kind):
    """sizes[i][j]: rows group rank i sends to group rank j. Uneven ones have zeros, a rank
    that sends nothing (row 0) and a rank that receives nothing (column n-1)."""
    if kind == "equal":
        return [[seed % 3] * n for _ in range(n)]     # 0, 1 or 2 rows per chunk
    g = torch.Generator().manual_seed(seed)
    m = torch.randint(0, 4, (n, n), generator=g)
    if n > 1:
        m[0, :] = 0
        m[:, n - 1] = 0
    return m.tolist()


def make(rows, row, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn((rows, *row), generator=g, dtype=torch.float64).to(dtype)
    return torch.randint(-1000, 1000, (rows, *row), generator=g, dtype=dtype)


def sweep():
    """On every rank, for each of its groups: every algorithm x dtype x row shape x split
    kind, against dist.all_to_all_single. Returns the mismatches."""
    bad, me = [], dist.get_rank()
    for group, n in groups():
        r = dist.get_rank(group)
        seed = 0
        for kind in ("equal", "equal", "equal", "uneven", "uneven"):
            for dtype in DTYPES:
                for row in [(), (3, 2)]:
                    seed += 1
                    m = split_matrix(n, seed, kind)
                    ins, outs = m[r], [m[i][r] for i in range(n)]
                    x = make(sum(ins), row, dtype, 1000 * seed + me)
                    ref = torch.empty((sum(outs), *row), dtype=dtype)
                    dist.all_to_all_single(ref, x, outs, ins, group=group)
                    algos = ALL_TO_ALLS if kind == "equal" else {"pairwise": all_to_all}
                    for name, fn in algos.items():
                        out = torch.full_like(ref, -7)
                        args = () if name == "bruck" else ((outs, ins) if kind == "uneven" else ())
                        got = fn(out, x, *args, group=group)
                        if got is not out or not torch.equal(out, ref):
                            bad.append(f"n={n} rank {r} {name} {kind} {dtype} row={row} splits {ins}->{outs}")
        # non-contiguous input and output (every other column of a wider tensor), uneven
        m = split_matrix(n, 99, "uneven")
        ins, outs = m[r], [m[i][r] for i in range(n)]
        x = make(sum(ins), (6,), torch.float32, me)[:, ::2]                  # (rows, 3), stride (6, 2)
        base = torch.zeros(sum(outs), 6)
        ref = torch.empty(sum(outs), 3)
        dist.all_to_all_single(ref, x.contiguous(), outs, ins, group=group)
        all_to_all(base[:, ::2], x, outs, ins, group=group)
        if not (torch.equal(base[:, ::2], ref) and not base[:, 1::2].any()):
            bad.append(f"n={n} rank {r}: non-contiguous input/output")
    return bad


def test_matches_torch_all_to_all_single(world):
    bad = [b for r in world(WORLD).run(sweep) for b in r]
    assert not bad, f"{len(bad)} mismatches, first: " + "\n".join(bad[:10])


def traced():
    """Per group of this rank: (group rank, n, events) of one equal float32 all-to-all per
    algorithm (5 elements per chunk), and one uneven (name "uneven")."""
    out = []
    for group, n in groups():
        r = dist.get_rank(group)
        for name, fn in ALL_TO_ALLS.items():
            tracer = Tracer(rank=r)
            fn(torch.empty(5 * n), torch.ones(5 * n), group=group, tracer=tracer)
            out.append((name, n, tracer.take()))
        m = split_matrix(n, 5, "uneven")
        tracer = Tracer(rank=r)
        all_to_all(torch.empty(sum(m[i][r] for i in range(n)), 2), torch.ones(sum(m[r]), 2),
                   [m[i][r] for i in range(n)], m[r], group=group, tracer=tracer)
        out.append(("uneven", n, tracer.take()))
    return out


def test_trace_bytes_and_peers_match_the_cost_model(world):
    per_group: dict = {}
    for results in world(WORLD).run(traced):
        for name, n, events in results:
            per_group.setdefault((name, n), []).extend(events)
    assert {n for _, n in per_group} == set(range(1, WORLD + 1))
    for (name, n), events in per_group.items():
        data = [e for e in events if e["kind"] in ("send", "recv") and e["name"] != "check"]
        assert all(s["nbytes"] == r["nbytes"] for s, r in match_messages(data))
        assert len(match_messages(data)) == sum(e["kind"] == "send" for e in data) and all(e["nbytes"] for e in data)
        sent = [sum(e["nbytes"] for e in data if e["kind"] == "send" and e["rank"] == r) for r in range(n)]
        received = [sum(e["nbytes"] for e in data if e["kind"] == "recv" and e["rank"] == r) for r in range(n)]
        peers = {r: [e["peer"] for e in sorted(data, key=lambda e: e["start"]) if e["kind"] == "send"
                     and e["rank"] == r] for r in range(n)}
        if name == "uneven":
            m = split_matrix(n, 5, "uneven")
            assert sent == [8 * sum(m[r][j] for j in range(n) if j != r) for r in range(n)]
            assert peers == {r: [(r + k) % n for k in range(1, n) if m[r][(r + k) % n]] for r in range(n)}
            continue
        assert sent == received == alltoall_bytes_per_rank(name, 4 * 5 * n, n), (name, n)
        steps = range(1, n) if name == "pairwise" else [1 << k for k in range((n - 1).bit_length())]
        assert peers == {r: [(r + k) % n for k in steps] for r in range(n)}, (name, n)


# ---------------------------------------------------------------- bad input
def attempt(thunk):
    """None if thunk() returns, else (exception type name, message)."""
    try:
        thunk()
        return None
    except Exception as e:  # noqa: BLE001
        return type(e).__name__, str(e)


def bad_calls(n, **kw):
    """{name: thunk} of calls that are bad in the same way on every rank; kw: group, tracer, check."""
    x = torch.ones(2 * n, 3)
    return {
        "split length": lambda: all_to_all(torch.empty(2 * n, 3), x, None, [2] * (n + 1), **kw),
        "split sum": lambda: all_to_all(torch.empty(2 * n, 3), x, [1] * n, None, **kw),
        "dtype": lambda: all_to_all(torch.empty(2 * n, 3, dtype=torch.float64), x, **kw),
        "many": lambda: all_to_all(torch.empty(2 * n, 2, dtype=torch.int64), x, [2.5] * n, [1] * (n - 1), **kw),
        "not a tensor": lambda: all_to_all([0.0] * 2 * n, x, **kw),
        "0-dim": lambda: all_to_all(torch.empty(2 * n, 3), torch.tensor(1.0), **kw),
        "in place": lambda: all_to_all(x, x, **kw),
        "expanded output": lambda: all_to_all(torch.empty(1, 3).expand(2 * n, 3), x, **kw),
        "bruck rows": lambda: bruck_all_to_all(torch.empty(2 * n + 1), torch.ones(2 * n + 1), **kw),
    }


WORDS = {"split length": ["input_split_sizes has 4 entries, need world_size=3"],
         "split sum": ["output_split_sizes=[1, 1, 1] sums to 3, but output has 6 rows"],
         "dtype": ["output.dtype=torch.float64 but input.dtype=torch.float32"],
         "many": ["output.dtype=torch.int64 but input.dtype=torch.float32", "differ beyond dim 0",
                  "output_split_sizes=[2.5, 2.5, 2.5]: row counts must be integers >= 0",
                  "input_split_sizes has 2 entries, need world_size=3"],
         "not a tensor": ["output must be a torch.Tensor, got list"],
         "0-dim": ["input is 0-dim"],
         "in place": ["output and input overlap in memory"],
         "expanded output": ["output's elements overlap in memory"],
         "bruck rows": ["input.shape[0]=7 is not divisible by world_size=3"]}


def bad_input():
    """On the 3 ranks of group [1, 3, 4] (the others return None): each bad call
    unchecked (raised on this rank), then checked (raised on every rank), then calls on
    which the ranks disagree; each stage's traced events; then a valid call."""
    group = next((g for g, n in groups() if n == 3), "none")
    if group == "none":
        return None
    r, n, tracer = dist.get_rank(group), 3, Tracer()
    unchecked = {k: attempt(t) for k, t in bad_calls(n, group=group, tracer=tracer, check=False).items()}
    unchecked_events = tracer.take()
    checked = {k: attempt(t) for k, t in bad_calls(n, group=group, tracer=tracer).items()}
    checked_events = tracer.take()
    x, kw = torch.ones(2 * n), {"group": group, "tracer": tracer}
    disagree = {
        "dtype on one rank": attempt(lambda: all_to_all(torch.empty(2 * n, dtype=x.dtype if r != 1 else torch.float64),
                                                        x if r != 1 else x.double(), **kw)),
        "splits": attempt(lambda: all_to_all(torch.empty(2 * n), x, [2, 2, 2], [3, 1, 2] if r == 0 else [2, 2, 2],
                                             **kw)),
        "bad list on one rank": attempt(lambda: all_to_all(torch.empty(2 * n), x, None, [6] if r == 2 else None, **kw)),
        "algorithms": attempt(lambda: (bruck_all_to_all if r == 0 else all_to_all)(torch.empty(2 * n), x, **kw)),
    }
    disagree_events = tracer.take()
    after = all_to_all(torch.empty(2 * n), torch.full((2 * n,), float(r)), group=group).tolist()  # still in step
    return r, unchecked, unchecked_events, checked, checked_events, disagree, disagree_events, after


def test_bad_input_raises_before_any_data_message_on_every_rank(world):
    results = [res for res in world(WORLD).run(bad_input) if res is not None]
    assert [res[0] for res in results] == [0, 1, 2]
    for r, unchecked, unchecked_events, checked, checked_events, disagree, disagree_events, after in results:
        assert unchecked_events == []                      # unchecked: nothing sent at all
        assert {e["name"] for e in checked_events + disagree_events if e["kind"] in ("send", "recv")} == {"check"}
        for name, words in WORDS.items():
            for got in (unchecked[name], checked[name]):
                assert got is not None and got[0] == "ValueError", (name, got)
                assert all(w in got[1] for w in words), (name, words, got[1])
            assert f"on rank {r}: bad arguments. Ranks [0, 1, 2]:" in checked[name][1], checked[name]
        for name, got in disagree.items():
            assert got is not None and got[0] == "ValueError" and f"on rank {r}:" in got[1], (name, got)
        assert "the ranks' rows differ: ranks [0, 2]: float32 rows of shape (); ranks [1]: float64 rows " \
               "of shape ()" in disagree["dtype on one rank"][1]
        assert "rank 0 sends 3 rows to rank 0, which expects 2, rank 0 sends 1 rows to rank 1, which expects 2" \
               in disagree["splits"][1]
        assert "Ranks [2]: input_split_sizes has 1 entry, need world_size=3" in disagree["bad list on one rank"][1]
        assert "ranks [0]: bruck_all_to_all; ranks [1, 2]: all_to_all" in disagree["algorithms"][1]
        assert after == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0]
    messages = {name: {res[3][name][1].split(": ", 1)[1] for res in results} for name in WORDS}
    assert all(len(m) == 1 for m in messages.values()), "every rank raises the same error"


# ---------------------------------------------------------------- the rules alone, no world
@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 6), rows=st.integers(0, 12), out_rows=st.integers(0, 12),
       splits=st.one_of(st.none(), st.lists(st.integers(-1, 6), min_size=0, max_size=7)),
       out_splits=st.one_of(st.none(), st.lists(st.integers(0, 6), min_size=0, max_size=7)))
def test_local_rules(n, rows, out_rows, splits, out_splits):
    def ok(sizes, k):
        return k % n == 0 if sizes is None else len(sizes) == n and min(sizes, default=0) >= 0 and sum(sizes) == k

    found, out, inp = problems(torch.empty(out_rows, 2), torch.empty(rows, 2), out_splits, splits, n)
    assert (not found) == (ok(splits, rows) and ok(out_splits, out_rows)), found
    assert all(("input" in p) != ("output" in p) for p in found)   # each names the one argument it is about
    if not found:
        assert inp == (splits or [rows // n] * n) and out == (out_splits or [out_rows // n] * n)


def test_only_overlapping_memory_counts_as_in_place():
    buf = torch.zeros(8, 2)
    assert problems(buf[:4], buf[4:], None, None, 2)[0] == []           # two halves of one buffer: fine
    assert "overlap in memory" in problems(buf[:4], buf[3:7], None, None, 2)[0][0]
    assert problems(torch.empty(0, 2), torch.empty(0, 2), None, [0, 0], 2) == ([], [0, 0], [0, 0])


# ---------------------------------------------------------------- cost model
def test_cost_model_by_hand():
    assert alltoall_time("pairwise", 1e6, 4, alpha=1e-5, beta=1e-9) == pytest.approx(3e-5 + 0.75e-3)
    assert alltoall_time("bruck", 1e6, 4, alpha=1e-5, beta=1e-9) == pytest.approx(2e-5 + 1e-3)  # lg 4 · n/2
    assert alltoall_time("bruck", 1e6, 8, alpha=0, beta=1e-9) == pytest.approx(3 * 0.5e-3)
    assert alltoall_time("pairwise", 1e6, 1, 1, 1) == 0 == alltoall_time("bruck", 1e6, 1, 1, 1)
    for p in range(1, 17):
        pairwise, bruck = alltoall_bytes_per_rank("pairwise", 64 * p, p), alltoall_bytes_per_rank("bruck", 64 * p, p)
        assert pairwise == [64 * (p - 1)] * p
        chunks = sum(1 for i in range(p) for k in range(8) if i >> k & 1)   # every set bit of every distance
        assert bruck == [64 * chunks] * p and bruck[0] <= math.ceil(math.log2(p)) * 64 * p / 2
    with pytest.raises(ValueError, match=r"algorithm='ring' is not one of \('pairwise', 'bruck'\); nbytes=-1: need "
                                         r"a number >= 0; world_size=0: need an integer >= 1; alpha=nan"):
        alltoall_time("ring", -1, 0, float("nan"), 1e-9)


# ---------------------------------------------------------------- bench
@pytest.mark.parametrize("argv, message", [
    (["alltoall", "--workers", "1"], "need an integer >= 2 workers"),
    (["alltoall", "--sizes", "4KB..3XB"], "cannot parse size '3XB'"),
    (["alltoall", "--sizes", "8B,4KB"], "--sizes 8B below 4 * workers = 16 bytes"),
    (["alltoall", "--algorithms", "pairwise,ring"], "unknown ['ring']; known: pairwise, bruck, torch"),
    (["alltoall", "--seconds", "0"], "need a number > 0"),
])
def test_bench_argument_errors_before_any_process(argv, message, capsys, monkeypatch):
    monkeypatch.setattr("ddnb.testing.World", None)  # starting a world would raise TypeError
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_bench_command_prints_rows(capsys, monkeypatch):
    def fake(workers, sizes, algorithms, *args, **kwargs):
        return [{"size": s, "workers": workers, "algorithm": a, "time": 1e-3, "iters": 1, "algbw": 1.0, "busbw": 0.75,
                 "threads": 1, "ratio_vs_torch": 1.0} for s in sizes for a in algorithms]

    monkeypatch.setattr(bench, "alltoall_benchmark", fake)
    assert main(["alltoall", "--sizes", "4KB,8KB", "--algorithms", "bruck,torch", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["size"], r["algorithm"]) for r in rows] == [(4096, "bruck"), (4096, "torch"), (8192, "bruck"),
                                                           (8192, "torch")]
    assert main(["alltoall", "--sizes", "4KB", "--workers", "3"]) == 0
    assert "4KB  torch" in capsys.readouterr().out


def test_bench_rows_tiny_run(world):
    rows = bench.alltoall_rows(world(WORLD), [4096, 1000], target_seconds=0.01, repeats=1)
    assert [(r["size"], r["algorithm"]) for r in rows] == [(s, a) for s in (4080, 984)   # multiples of 4·6
                                                           for a in ("pairwise", "bruck", "torch")]
    for r in rows:
        assert r["time"] > 0 and r["busbw"] == pytest.approx(r["algbw"] * 5 / 6)
        assert r["ratio_vs_torch"] == pytest.approx(r["busbw"] / rows[2 if r["size"] == 4080 else 5]["busbw"])
    with pytest.raises(ValueError, match="below 4 \\* workers = 24 B"):
        bench.alltoall_rows(world(WORLD), [16])
