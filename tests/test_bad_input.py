"""Bad input across the public API, property-based (hypothesis): the collectives, the
sampler, the cost calculators and the process grid. Every bad value gets a clear error
(a ValueError or TypeError whose message names the argument or the rule), none a hang,
none a silently wrong result; valid random values give the documented result.

    .venv/bin/python -m pytest tests/test_bad_input.py -q        # about 20 s on 2 cores

Collectives: each example is one `World.run_ranks` on the 3 ranks of the session's
`world(3)` (tests/conftest.py), with a short deadline, so a hang is reported as one
(WorkerTimeoutError) instead of blocking the suite. Each rank gets its own call, drawn so
that ranks often disagree (shape, dtype, op, root, algorithm, kind of input); a small
model of the rules says whether the call is valid: then every rank must match
torch.distributed on the same inputs (exactly: the values are small integers, so every
order of summation gives the same bits), else every rank must raise, naming the problem.
These examples do not shrink (Phase.shrink is off): each would cost a world, and a hang
the deadline.

Already tested elsewhere, so not repeated here:
- tests/test_collectives.py: every all-reduce against torch for world sizes 1-6 and every
  op x dtype (float32/64, fp16, bf16, int64) x size; hand-picked mismatches and bad ops.
- tests/test_data_parallel.py::test_shards_cover_the_dataset_once_per_epoch: the shards
  partition the indices (hypothesis); tests/test_checkpoint.py: one state_dict resume.
- tests/test_process_grid.py::test_every_axis_partitions_the_world: every rank once per
  axis group (hypothesis); hand-picked bad grids.
- tests/test_cost*.py: the formulas by hand, hand-picked bad values; test_cost_scaling.py:
  more workers never faster, a faster network never slower (hypothesis).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.distributed as dist
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from ddnb.collectives import ALLREDUCES, OPS, broadcast, chunk_bounds, reduce, ring_allgather, ring_reduce_scatter
from ddnb.cost import (allreduce_bytes_per_rank, allreduce_time, boundary_bytes, dataset_bytes, fit_alpha_beta,
                       flops_per_token, interleaved_bubble_fraction, max_params, model_flops_utilization,
                       model_parallel_bytes, model_parallel_idle_fraction, peak_microbatches_in_flight,
                       pipeline_activation_bytes, pipeline_bubble_fraction, pipeline_step_time,
                       sequential_idle_fractions, token_bytes, training_days, training_flops, training_memory,
                       transformer_params, zero_memory, zero_memory_parts)
from ddnb.cost.scaling import (NETWORKS, communication_time, hierarchical_allreduce_time, network,
                               parameter_server_time, step_time, torus2d_allreduce_time)
from ddnb.data_parallel.sampler import ShardSampler
from ddnb.runtime.errors import WorkerError, WorkerTimeoutError
from ddnb.process_grid import ProcessGrid

N = 3                 # ranks: not a power of two, so halving-doubling folds a pair
CALL_TIMEOUT = 15     # seconds for one example on all ranks; a hang becomes WorkerTimeoutError
WORLD_SETTINGS = settings(max_examples=25, deadline=None, phases=(Phase.explicit, Phase.reuse, Phase.generate),
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
PURE_SETTINGS = settings(max_examples=100, deadline=None)

# ================================================================ collectives
# A call is plain data (it travels to the ranks and the model reads it):
#   {"fn": one of FNS, "tensor": TensorSpec, "op": ("raw", value) | ("reduceop", NAME),
#    "root": value (reduce / broadcast only), "group": one of GROUPS (the same on every rank)}
# TensorSpec: ("tensor", shape, dtype name, layout) or ("object", name of a non-tensor).
WHAT = {"naive": "naive_allreduce", "tree": "tree_allreduce", "ring": "ring_allreduce",
        "halving_doubling": "halving_doubling_allreduce", "reduce": "reduce", "broadcast": "broadcast",
        "reduce_scatter": "ring_reduce_scatter", "allgather": "ring_allgather"}
FNS = tuple(WHAT)
ROOTED, OPLESS = ("reduce", "broadcast"), ("broadcast", "allgather")
SEGMENTED = ("ring", "reduce_scatter", "allgather")      # take segment_bytes (every rank the same)
SUPPORTED = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8")
UNSUPPORTED_DTYPES = ("bool", "complex64")
LAYOUTS = ("contiguous", "transposed", "strided")         # all valid: the library copies and writes back
BAD_LAYOUTS = ("expanded", "sparse", "meta")
OBJECTS = ("list", "ndarray", "int", "float", "none", "str")
REDUCE_OP_NAMES = ("SUM", "AVG", "MAX", "MIN", "PRODUCT")
GROUPS = ("default", "world", "pair")                     # pair: ranks 0 and 1; rank 2 is not a member
BAD_GROUPS = ("str", "int", "object")
TORCH_OP = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "max": dist.ReduceOp.MAX,
            "min": dist.ReduceOp.MIN, "product": dist.ReduceOp.PRODUCT}


# ---------------------------------------------------------------- the model of the rules
def op_name(call):
    """The op the library should resolve: a name in OPS, None (no op), or "bad"."""
    kind, value = call["op"]
    if call["fn"] in OPLESS:
        return None
    if kind == "reduceop":
        return value.lower() if value in REDUCE_OP_NAMES else "bad"
    return value.lower() if isinstance(value, str) and value.lower() in OPS else "bad"


def members(call):
    return [0, 1] if call["group"] == "pair" else list(range(N))


def root_ok(call):
    root, n = call.get("root"), len(members(call))
    return isinstance(root, int) and not isinstance(root, bool) and 0 <= root < n


def input_kind(spec):
    if spec[0] == "object":
        return "object"
    _, shape, _, layout = spec
    if layout == "expanded":
        return "overlap" if shape and shape[0] > 1 and math.prod(shape) > 0 else "tensor"
    return {"sparse": "sparse", "meta": "meta"}.get(layout, "tensor")


def problems(call):
    """Words one of which the error of this rank's call must contain; [] if it is valid."""
    words = []
    kind = input_kind(call["tensor"])
    words += {"object": ["expected a torch.Tensor"], "sparse": ["strided"], "meta": ["meta"],
              "overlap": ["overlap"], "tensor": []}[kind]
    op = op_name(call)
    if op == "bad":
        words.append("is not supported; use one of")
    if call["fn"] in ROOTED and not root_ok(call):
        words.append("root rank")
    if kind == "tensor":
        dtype = call["tensor"][2]
        if dtype in UNSUPPORTED_DTYPES:
            words.append(f"dtype torch.{dtype} is not supported")
        elif op == "avg" and not dtype.startswith(("float", "bfloat")):
            words.append("needs a floating-point tensor")
    return words


def header(call):
    """What the cross-rank check compares: equal headers = the same call."""
    spec, kind = call["tensor"], input_kind(call["tensor"])
    tensor = ("object",) if kind == "object" else (kind, tuple(spec[1]), spec[2])
    root = (call["root"] if root_ok(call) else "bad") if call["fn"] in ROOTED else None
    segment = min(call.get("segment_bytes") or 4 << 20, 1 << 62) if call["fn"] in SEGMENTED else None
    return (WHAT[call["fn"]], tensor, op_name(call), root, segment)


def expectation(calls):
    """Per rank: ("ok", None) or ("error", words) or ("different", None) or ("not a member", None)."""
    if calls[0]["group"] in BAD_GROUPS:
        return [("error", ["group must be a torch.distributed ProcessGroup"])] * N
    ranks = members(calls[0])
    out = [("not a member", None)] * N
    same = len({repr(header(calls[r])) for r in ranks}) == 1
    for r in ranks:
        words = problems(calls[r])
        out[r] = ("different", None) if not same else ("error", words) if words else ("ok", None)
    return out


# ---------------------------------------------------------------- on the ranks
_PAIR = {}


def make_group(name):
    if "pair" not in _PAIR:        # every rank, at the same point: new_group is collective
        _PAIR["pair"] = dist.new_group([0, 1])
    return {"default": None, "world": dist.group.WORLD, "pair": _PAIR["pair"], "str": "tp", "int": 1,
            "object": object()}[name]


def values(shape, dtype, rank, seed, op=None):
    """Rank `rank`'s input: small integers (products of three stay exact even in bf16), so
    every order of reduction gives the same bits."""
    g = torch.Generator().manual_seed(7919 * seed + rank)
    lo, hi = (-3, 4) if op == "product" else (-8, 9)
    if dtype == torch.uint8:
        lo, hi = 0, hi
    return torch.randint(lo, hi, tuple(shape), generator=g).to(dtype)


def build(spec, rank, seed, op=None):
    if spec[0] == "object":
        return {"list": [1.0, 2.0], "ndarray": np.ones(3, np.float32), "int": 3, "float": 1.5, "none": None,
                "str": "x"}[spec[1]]
    _, shape, dtype, layout = spec
    dtype = getattr(torch, dtype)
    x = values(shape, dtype, rank, seed, op)
    if layout == "meta":
        return torch.empty(shape, dtype=dtype, device="meta")
    if layout == "sparse":
        return x.to_sparse()
    if layout == "expanded":     # one row repeated: the rows share memory
        return x[:1].expand(shape) if shape else x
    if layout == "transposed" and len(shape) >= 2:
        return x.transpose(0, 1).contiguous().transpose(0, 1)      # same values, column-major
    if layout in ("transposed", "strided") and shape:
        wide = torch.zeros(*shape[:-1], 2 * shape[-1], dtype=dtype)
        wide[..., ::2] = x
        return wide[..., ::2]                                        # every other element
    return x


def make_op(call):
    kind, value = call["op"]
    return getattr(dist.ReduceOp, value) if kind == "reduceop" else value


def invoke(call, tensor, group):
    fn, op, root = call["fn"], make_op(call), call.get("root")
    kw = {"segment_bytes": call["segment_bytes"]} if fn in SEGMENTED and call.get("segment_bytes") else {}
    if fn in ALLREDUCES:
        return ALLREDUCES[fn](tensor, op=op, group=group, **kw)
    if fn == "reduce":
        return reduce(tensor, dst=root, op=op, group=group)
    if fn == "broadcast":
        return broadcast(tensor, src=root, group=group)
    if fn == "reduce_scatter":
        return ring_reduce_scatter(tensor, op=op, group=group, **kw)
    return ring_allgather(tensor, group=group, **kw)


def reference(call, seed, group, ranks):
    """What the call must give on this rank, from torch.distributed on the same inputs
    (computed before the call, on every member: nothing may block after it)."""
    rank = dist.get_rank()
    _, shape, dtype_name, _ = call["tensor"]
    dtype, op = getattr(torch, dtype_name), op_name(call)
    mine = values(shape, dtype, rank, seed, op)
    wide = dtype if dtype.is_floating_point else torch.int64   # gloo has no int16; wrap-around is the same
    if call["fn"] == "broadcast":
        out = mine.to(wide, copy=True)
        dist.broadcast(out, src=ranks[call["root"]], group=group)
        return out.to(dtype)
    if call["fn"] == "allgather":     # chunk c of every rank's result: chunk c of rank c's input
        flat = torch.cat([values(shape, dtype, ranks[c], seed, op).reshape(-1)[a:b]
                          for c, (a, b) in enumerate(chunk_bounds(mine.numel(), len(ranks)))])
        return flat.reshape(shape)
    out = mine.to(wide, copy=True)
    dist.all_reduce(out, op=TORCH_OP[op], group=group)
    out = out.to(dtype)
    if call["fn"] == "reduce" and ranks.index(rank) != call["root"]:
        return mine                   # the other ranks' tensors are left unchanged
    if call["fn"] == "reduce_scatter":
        a, b = chunk_bounds(out.numel(), len(ranks))[ranks.index(rank)]
        return out.reshape(-1)[a:b]
    return out


def run_call(calls, seed, expected):
    """One example on this rank: the reference (if valid), then the call. Returns
    ("error", type, message) or ("ok", why-not-equal or None)."""
    rank = dist.get_rank()
    call = calls[rank]
    group = make_group(call["group"])
    ranks = members(call)
    ref = reference(call, seed, group, ranks) if expected[rank][0] == "ok" else None
    tensor = build(call["tensor"], rank, seed, op_name(call))
    try:
        out = invoke(call, tensor, group)
    except Exception as e:  # noqa: BLE001 - the error is the result
        return ("error", type(e).__name__, str(e))
    if ref is None:
        return ("ok", "returned instead of raising")
    if call["fn"] != "reduce_scatter" and out is not tensor:
        return ("ok", "did not return its input")
    if out.dtype != ref.dtype or out.shape != ref.shape or not torch.equal(out, ref):
        return ("ok", f"got {out.tolist()}, torch.distributed {ref.tolist()}")
    return ("ok", None)


def check_example(world, calls, seed=0):
    expected = expectation(calls)
    try:
        got = world(N).run_ranks(run_call, [(calls, seed, expected)] * N, timeout=CALL_TIMEOUT)
    except (WorkerTimeoutError, WorkerError) as e:
        pytest.fail(f"a rank blocked (hang) or crashed on {calls}: {e}")
    for rank, ((want, words), result) in enumerate(zip(expected, got)):
        where = f"rank {rank}, calls {calls}: got {result}"
        if want == "ok":
            assert result == ("ok", None), where
            continue
        assert result[0] == "error" and result[1] in ("ValueError", "TypeError"), where
        message = result[2]
        if want == "different":
            assert "the ranks made different calls" in message and f"on rank {rank}" in message, where
        elif want == "not a member":
            assert "is not a member of this group" in message, where
        else:
            assert any(w in message for w in words), f"{where}; expected one of {words}"


# ---------------------------------------------------------------- strategies
shapes = st.one_of(st.lists(st.integers(0, 4), max_size=3).map(tuple),
                   st.lists(st.integers(1, 2), min_size=9, max_size=10).map(tuple))    # > 8 dims: hashed
valid_ops = st.one_of(st.sampled_from(OPS).map(lambda o: ("raw", o)),
                      st.sampled_from(OPS).map(lambda o: ("raw", o.upper())),
                      st.sampled_from(REDUCE_OP_NAMES).map(lambda o: ("reduceop", o)))
bad_ops = st.one_of(st.text(max_size=6).map(lambda o: ("raw", o)),
                    st.sampled_from(["mean", "add", "Sum ", None, 0, 1.5, True]).map(lambda o: ("raw", o)),
                    st.sampled_from(["BAND", "BOR", "BXOR"]).map(lambda o: ("reduceop", o)))
valid_roots = st.integers(0, N - 1)
bad_roots = st.one_of(st.integers(-3, -1), st.integers(N, N + 3), st.integers(2 ** 63, 2 ** 70),
                      st.sampled_from([None, 1.0, "0", True]))


@st.composite
def tensor_specs(draw, valid=True):
    if not valid and draw(st.integers(0, 3)) == 0:
        return ("object", draw(st.sampled_from(OBJECTS)))
    dtype = draw(st.sampled_from(SUPPORTED + (() if valid else UNSUPPORTED_DTYPES)))
    layout = draw(st.sampled_from(LAYOUTS + (() if valid else BAD_LAYOUTS)))
    shape = draw(shapes)
    if layout == "sparse" and not shape:
        shape = (2,)
    return ("tensor", shape, dtype, layout)


@st.composite
def valid_calls(draw, fn=None, group=None):
    fn = fn or draw(st.sampled_from(FNS))
    call = {"fn": fn, "tensor": draw(tensor_specs()), "op": draw(valid_ops),
            "group": group or draw(st.sampled_from(GROUPS))}
    if op_name(call) == "avg" and not call["tensor"][2].startswith(("float", "bfloat")):
        call["op"] = ("raw", "sum")
    if fn in ROOTED:
        call["root"] = draw(st.integers(0, len(members(call)) - 1))
    if fn in SEGMENTED:     # many small pipeline segments, or more than int64 holds (one per chunk)
        call["segment_bytes"] = draw(st.one_of(st.none(), st.integers(8, 64), st.integers(2 ** 62, 2 ** 70)))
    return call


@st.composite
def mutated(draw, call):
    """The call with one argument changed, often to a bad value."""
    field = draw(st.sampled_from(["shape", "dtype", "op", "root", "tensor", "fn"]))
    call = dict(call)
    spec = call["tensor"]
    if field == "shape" and spec[0] == "tensor":
        call["tensor"] = (spec[0], draw(shapes), spec[2], spec[3])
    elif field == "dtype" and spec[0] == "tensor":
        call["tensor"] = (spec[0], spec[1], draw(st.sampled_from(SUPPORTED + UNSUPPORTED_DTYPES)), spec[3])
    elif field == "op":
        call["op"] = draw(st.one_of(valid_ops, bad_ops))
    elif field == "root" and call["fn"] in ROOTED:
        call["root"] = draw(st.one_of(valid_roots, bad_roots))
    elif field == "tensor":
        call["tensor"] = draw(tensor_specs(valid=False))
    elif field == "fn":
        call["fn"] = draw(st.sampled_from(FNS))
        call.setdefault("root", 0)
    return call


@st.composite
def bad_cases(draw):
    """Per-rank calls: the same valid call, each rank's possibly changed; or one bad value
    passed by every rank; or a bad group."""
    base = draw(valid_calls())
    how = draw(st.sampled_from(["per rank", "per rank", "all ranks", "bad group"]))
    if how == "bad group":
        return [dict(base, group=draw(st.sampled_from(BAD_GROUPS)))] * N
    if how == "all ranks":
        return [draw(mutated(base))] * N
    return [draw(st.one_of(st.just(base), mutated(base))) for _ in range(N)]


def same(call, **changes):
    return [dict(call, **changes)] * N


def per_rank(call, **changes):
    """The call on every rank, with rank r's fields set from changes' r-th values."""
    return [dict(call, **{k: v[r] for k, v in changes.items()}) for r in range(N)]


PLAIN = {"fn": "ring", "tensor": ("tensor", (4,), "float32", "contiguous"), "op": ("raw", "sum"), "group": "default"}


@WORLD_SETTINGS
@given(calls=bad_cases(), seed=st.integers(0, 1000))
# the bugs found here, kept as explicit examples; before the fix in ddnb/collectives/ops.py:
@example(calls=same(PLAIN, fn="naive", op=("raw", None)), seed=0)            # ranks 1, 2 hung
@example(calls=per_rank(PLAIN, tensor=[PLAIN["tensor"], ("object", "list"), PLAIN["tensor"]]), seed=0)  # hung
@example(calls=per_rank(dict(PLAIN, fn="reduce"), root=[0, 5, 0]), seed=0)   # ranks 0, 2 hung
@example(calls=per_rank(dict(PLAIN, fn="broadcast"), root=[1, 1.0, 1]), seed=0)                          # hung
@example(calls=per_rank(PLAIN, tensor=[PLAIN["tensor"], ("tensor", (4,), "float32", "sparse"),
                                       PLAIN["tensor"]]), seed=0)                                     # hung
@example(calls=per_rank(PLAIN, tensor=[PLAIN["tensor"], ("tensor", (4,), "float32", "meta"),
                                       PLAIN["tensor"]]), seed=0)                                     # hung
@example(calls=same(dict(PLAIN, fn="reduce"), root=1.0), seed=0)             # TypeError: float & int
@example(calls=same(PLAIN, group="str"), seed=0)                             # AttributeError: 'str' ... 'size'
@example(calls=same(PLAIN, fn="halving_doubling", group="pair", op=("raw", "avg")), seed=0)  # rank 2: -x
@example(calls=same(PLAIN, group="pair"), seed=0)                            # rank 2: "need numel >= 0 ..."
@example(calls=per_rank(PLAIN, segment_bytes=[2 ** 64, 2 ** 70, 2 ** 64]), seed=0)  # "Overflow when unpacking"
@example(calls=per_rank(PLAIN, tensor=[("tensor", (3, 2), "float32", t) for t in ("contiguous", "expanded",
                                                                                   "contiguous")]), seed=0)
def test_bad_calls_raise_on_every_rank_never_hang(world, calls, seed):
    check_example(world, calls, seed)


@WORLD_SETTINGS
@given(call=valid_calls(), seed=st.integers(0, 1000))
@example(call=dict(PLAIN, tensor=("tensor", (2, 3), "int16", "transposed"), op=("reduceop", "PRODUCT")), seed=1)
def test_valid_calls_match_torch_distributed(world, call, seed):
    """Random shapes (0-dim, empty, > 8 dims), every supported dtype (int8/16/32, uint8
    too), ops as names or ReduceOps, non-contiguous layouts, roots, a sub-group."""
    check_example(world, [call] * N, seed)


def _ring_bad_pipeline_on_one_rank(algorithm, name, value):
    kwargs = {name: value} if dist.get_rank() == 1 else {}
    try:
        ALLREDUCES[algorithm](torch.ones(4), **kwargs)
    except ValueError as e:
        return str(e)


@pytest.mark.parametrize("name, value", [("segment_bytes", 0), ("depth", 0), ("segment_bytes", True), ("depth", 1.5)])
def test_ring_bad_pipeline_on_one_rank_raises_everywhere(world, name, value):
    """A bad segment_bytes or depth on rank 1 alone: every rank raises the listing of the
    calls, rank 1's marked as bad, and none waits for the ring; the same bad value on every
    rank: each names it."""
    results = world(N).run(_ring_bad_pipeline_on_one_rank, "ring", name, value, timeout=15)
    assert all("made different calls: ranks [0, 2]" in r and "ranks [1]: ring_allreduce(" in r
               and "segment_bytes or depth=<not an integer >= 1>" in r for r in results), results
    everywhere = world(N).run(_ring_bad_pipeline_everywhere, name, value, timeout=15)
    assert all(f"{name}={value!r}" in r and "integers segment_bytes >= 1 and depth >= 1" in r
               for r in everywhere), everywhere


def _ring_bad_pipeline_everywhere(name, value):
    try:
        ALLREDUCES["ring"](torch.ones(4), **{name: value})
    except ValueError as e:
        return str(e)


# ================================================================ sampler
def sampler_rules_broken(dataset, num_replicas, rank, seed, shuffle, drop_last) -> set:
    """The arguments that break a rule (the error must name one of them); empty if valid."""
    def is_int(v):
        return isinstance(v, int) and not isinstance(v, bool)

    broken = set()
    n = dataset if is_int(dataset) else len(dataset) if hasattr(dataset, "__len__") else None
    if n is None:
        broken.add("dataset")
    if num_replicas is None or rank is None:      # torch.distributed's, and it is not initialized here
        broken.add("num_replicas")
    for name, v in (("num_replicas", num_replicas), ("rank", rank), ("seed", seed)):
        if not is_int(v) and (v is not None or name == "seed"):
            broken.add(name)
    broken |= {name for name, v in (("shuffle", shuffle), ("drop_last", drop_last)) if not isinstance(v, bool)}
    if is_int(seed) and not -2 ** 63 <= seed < 2 ** 63:
        broken.add("seed")
    if is_int(num_replicas) and (num_replicas < 1 or n is not None and num_replicas > n):
        broken.add("num_replicas")
    if is_int(rank) and is_int(num_replicas) and not 0 <= rank < num_replicas:
        broken.add("rank")
    return broken


anything = st.one_of(st.none(), st.booleans(), st.floats(allow_nan=True), st.text(max_size=3),
                     st.lists(st.integers(), max_size=2), st.complex_numbers())


@PURE_SETTINGS
@given(dataset=st.one_of(st.integers(-3, 40), st.lists(st.integers(), max_size=40), anything),
       num_replicas=st.one_of(st.integers(-2, 8), anything), rank=st.one_of(st.integers(-2, 8), anything),
       seed=st.one_of(st.integers(-2 ** 64, 2 ** 64), anything), shuffle=st.one_of(st.booleans(), anything),
       drop_last=st.one_of(st.booleans(), anything))
def test_sampler_bad_arguments_are_named(dataset, num_replicas, rank, seed, shuffle, drop_last):
    broken = sampler_rules_broken(dataset, num_replicas, rank, seed, shuffle, drop_last)
    if not broken:
        s = ShardSampler(dataset, num_replicas, rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
        assert list(s) == s.indices() and len(s.indices()) == len(s)
        return
    with pytest.raises((ValueError, TypeError)) as info:
        ShardSampler(dataset, num_replicas, rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
    message = str(info.value)
    assert any(name in message for name in broken) and "ShardSampler" in message, (broken, message)


configs = st.tuples(st.integers(1, 60), st.integers(1, 6), st.integers(0, 5), st.integers(-2 ** 63, 2 ** 63 - 1),
                    st.booleans(), st.booleans()).filter(lambda c: c[1] <= c[0])


@PURE_SETTINGS
@given(config=configs, epoch=st.integers(0, 2 ** 63 - 2), data=st.data())
def test_sampler_state_dict_round_trips(config, epoch, data):
    n, replicas, rank, seed, shuffle, drop_last = config
    rank %= replicas
    a = ShardSampler(n, replicas, rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
    a.set_epoch(epoch)
    a.start = data.draw(st.integers(0, len(a)))
    b = ShardSampler(n, replicas, rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
    b.load_state_dict(a.state_dict())
    assert b.state_dict() == a.state_dict()
    assert list(b) == a.indices()[a.start:] == list(a)
    b.set_epoch(epoch)                      # the resumed epoch keeps its place
    assert list(b) == list(a)
    b.set_epoch(epoch + 1)                  # a new epoch starts at its first item
    assert b.start == 0 and list(b) == b.indices()


@PURE_SETTINGS
@given(epoch=st.one_of(st.integers(-5, -1), st.integers(2 ** 63, 2 ** 65), anything))
def test_sampler_bad_epoch_is_named(epoch):
    s = ShardSampler(10, 2, 0)
    with pytest.raises((ValueError, TypeError), match="epoch"):
        s.set_epoch(epoch)
    assert s.epoch == 0 and list(s) == s.indices()


@PURE_SETTINGS
@given(key=st.sampled_from(["epoch", "start", "seed", "num_items", "num_replicas", "rank", "shuffle",
                            "drop_last"]),
       value=st.one_of(st.integers(-3, 100), anything), drop=st.booleans(),
       state=st.one_of(st.none(), st.lists(st.integers(), max_size=2), st.text(max_size=3)))
def test_sampler_bad_state_is_named(key, value, drop, state):
    s = ShardSampler(20, 4, 1, seed=7)       # 5 items per epoch
    good = s.state_dict()
    with pytest.raises((ValueError, TypeError), match="state"):
        s.load_state_dict(state)                 # not a dict
    bad = {k: v for k, v in good.items() if k != key} if drop else dict(good, **{key: value})
    valid = not drop and (value == good[key] if key not in ("epoch", "start")      # 1 == True: the same shards
                          else isinstance(value, int) and not isinstance(value, bool)
                          and 0 <= value and (key == "epoch" or value <= 5))
    if valid:
        s.load_state_dict(bad)
        assert s.state_dict() == bad
        return
    with pytest.raises((ValueError, TypeError)) as info:
        s.load_state_dict(bad)
    assert key in str(info.value), str(info.value)
    assert s.state_dict() == good              # nothing changed


# ================================================================ cost calculators
def _finite(lo, hi):
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False)


# kinds of argument: (valid values, bad values). Wrong types come in every bad set.
WRONG_TYPES = st.sampled_from(["1", None, [1.0], 1j, True, False, b"1", {}])
NONFINITE = st.sampled_from([math.nan, math.inf, -math.inf])
KINDS = {
    "nonneg": (_finite(0, 1e9), st.one_of(_finite(-1e9, -1e-300), NONFINITE, WRONG_TYPES)),
    "pos": (_finite(1e-3, 1e9), st.one_of(_finite(-1e9, 0), NONFINITE, WRONG_TYPES)),
    "count": (st.integers(1, 12), st.one_of(st.integers(-10 ** 6, 0), st.sampled_from([1.0, 2.5, 2.0, math.nan]),
                                            WRONG_TYPES)),
    "fraction": (_finite(1e-3, 1), st.one_of(_finite(1.0001, 1e6), _finite(-1, 0), NONFINITE, WRONG_TYPES)),
    "stage": (st.sampled_from([0, 1, 2, 3]), st.one_of(st.integers(4, 100), st.integers(-100, -1),
                                                       st.sampled_from([1.0, "1", True, None]))),
}


def choice(*names):
    return (st.sampled_from(names), st.one_of(st.text(max_size=8).filter(lambda t: t not in names),
                                              st.sampled_from([None, 1, names[0].upper() + "x"])))


ALGO = choice("naive", "tree", "ring", "halving_doubling")
# name: (function, {argument: kind or (valid, bad)}); every argument passed by keyword
COST = {
    "allreduce_time": (allreduce_time, {"algorithm": ALGO, "nbytes": "nonneg", "world_size": "count",
                                        "alpha": "nonneg", "beta": "nonneg", "gamma": "nonneg"}),
    "allreduce_bytes_per_rank": (allreduce_bytes_per_rank, {"algorithm": ALGO, "nbytes": "nonneg",
                                                            "world_size": "count"}),
    "pipeline_bubble_fraction": (pipeline_bubble_fraction, {"stages": "count", "microbatches": "count"}),
    "interleaved_bubble_fraction": (interleaved_bubble_fraction, {"stages": "count", "microbatches": "count",
                                                                  "chunks": "count"}),
    "model_parallel_idle_fraction": (model_parallel_idle_fraction, {"stages": "count"}),
    "pipeline_step_time": (pipeline_step_time, {"stages": "count", "microbatches": "count", "t_forward": "nonneg",
                                                "t_backward": "nonneg"}),
    "peak_microbatches_in_flight": (peak_microbatches_in_flight, {
        "schedule": choice("gpipe", "1f1b", "interleaved"), "stages": "count", "microbatches": "count",
        "rank": (st.just(0), st.one_of(st.integers(-5, -1), st.integers(13, 100), st.sampled_from([0.0, "0"]))),
        "chunks": "count"}),
    "pipeline_activation_bytes": (pipeline_activation_bytes, {
        "schedule": choice("gpipe", "1f1b", "interleaved"), "stages": "count", "microbatches": "count",
        "bytes_per_microbatch": "count"}),
    "boundary_bytes": (boundary_bytes, {"batch_size": "count", "seq_len": "count", "d_model": "count",
                                        "element_size": "count"}),
    "model_parallel_bytes": (model_parallel_bytes, {"stages": "count", "activation_bytes": "nonneg"}),
    "zero_memory": (zero_memory, {"num_params": "pos", "world_size": "count", "stage": "stage", "k": "nonneg",
                                  "param_bytes": "nonneg", "grad_bytes": "nonneg"}),
    "zero_memory_parts": (zero_memory_parts, {"num_params": "pos", "world_size": "count", "stage": "stage",
                                              "k": "nonneg", "param_bytes": "nonneg", "grad_bytes": "nonneg"}),
    "transformer_params": (transformer_params, {"n_layers": "count", "d_model": "count", "vocab_size": "count",
                                                "seq_len": "count", "mlp_ratio": "count"}),
    "training_flops": (training_flops, {"num_params": "pos", "num_tokens": "pos"}),
    "flops_per_token": (flops_per_token, {"n_layers": "count", "d_model": "count", "vocab_size": "count",
                                          "seq_len": "count", "mlp_ratio": "count"}),
    "model_flops_utilization": (model_flops_utilization, {"tokens_per_second": "pos", "flops_per_token": "pos",
                                                          "peak_flops": "pos"}),
    "training_days": (training_days, {"total_flops": "pos", "peak_flops": "pos", "n_devices": "count",
                                      "mfu": "fraction", "scaling_efficiency": "fraction"}),
    "training_memory": (training_memory, {"n_layers": "count", "d_model": (st.just(12), KINDS["count"][1]),
                                          "n_heads": (st.sampled_from([1, 2, 3, 4, 6, 12]), KINDS["count"][1]),
                                          "vocab_size": "count", "seq_len": "count", "batch_size": "count",
                                          "precision": choice("mixed", "fp32"),
                                          "optimizer": choice("adam", "momentum", "sgd"), "mlp_ratio": "count"}),
    "max_params": (max_params, {"memory_bytes": "pos", "precision": choice("mixed", "fp32")}),
    "token_bytes": (token_bytes, {"vocab_size": "count"}),
    "dataset_bytes": (dataset_bytes, {"num_tokens": "pos", "bytes_per_token": "pos"}),
    "network": (network, {"bandwidth_gbps": "pos", "latency_us": "nonneg"}),
    "parameter_server_time": (parameter_server_time, {"nbytes": "nonneg", "workers": "count", "alpha": "nonneg",
                                                      "beta": "nonneg", "gamma": "nonneg", "servers": "count"}),
    "torus2d_allreduce_time": (torus2d_allreduce_time, {"nbytes": "nonneg", "rows": "count", "cols": "count",
                                                        "alpha": "nonneg", "beta": "nonneg", "gamma": "nonneg"}),
    "hierarchical_allreduce_time": (hierarchical_allreduce_time, {
        "nbytes": "nonneg", "workers": (st.just(8), KINDS["count"][1]), "per_node": (st.sampled_from([1, 2, 4, 8]),
                                                                                      KINDS["count"][1]),
        "intra": (st.just(NETWORKS["400G InfiniBand"]), st.sampled_from(["fast", None, 1e9])),
        "inter": (st.just(NETWORKS["100G Ethernet"]), st.sampled_from(["fast", None, 1e9])),
        "gamma": "nonneg", "inter_algorithm": ALGO}),
    "communication_time": (communication_time, {
        "algorithm": choice("ps_central", "ps_sharded", "tree", "ring", "halving_doubling", "hierarchical",
                            "torus2d"),
        "num_params": "pos", "workers": (st.sampled_from([1, 2, 4, 8, 16, 64]), KINDS["count"][1]),
        "net": (st.sampled_from(list(NETWORKS.values())), st.sampled_from(["fast", None, 100e9])),
        "bytes_per_param": "pos", "gamma": "nonneg", "bucket_bytes": (st.one_of(st.none(), _finite(1e3, 1e9)),
                                                                      KINDS["pos"][1].filter(lambda v: v is not None)),
        "servers": "count", "per_node": (st.sampled_from([1, 2, 4, 8]), KINDS["count"][1]),
        "intra": (st.just(NETWORKS["400G InfiniBand"]), st.sampled_from(["nvlink", 1e9])),
        "inter_algorithm": ALGO}),
    "step_time": (step_time, {"algorithm": choice("ring", "tree", "ps_central"), "num_params": "pos",
                              "workers": "count", "compute_time": "nonneg",
                              "net": (st.sampled_from(list(NETWORKS.values())), st.sampled_from(["fast", None]))}),
}


def kind_of(spec):
    return KINDS[spec] if isinstance(spec, str) else spec


def numbers_in(result):
    import dataclasses

    if dataclasses.is_dataclass(result):       # a Link (network()): its fields
        return numbers_in(dataclasses.asdict(result))
    if isinstance(result, dict):
        return [v for value in result.values() for v in numbers_in(value)]
    if isinstance(result, (list, tuple)):
        return [v for value in result for v in numbers_in(value)]
    return [result]


@PURE_SETTINGS
@given(name=st.sampled_from(sorted(COST)), data=st.data())
def test_cost_valid_input_gives_finite_non_negative_numbers(name, data):
    fn, args = COST[name]
    kwargs = {a: data.draw(kind_of(spec)[0], label=a) for a, spec in args.items()}
    result = fn(**kwargs)
    for v in numbers_in(result):
        if isinstance(v, str):     # network()'s name
            continue
        assert isinstance(v, (int, float)) and math.isfinite(v) and v >= 0, (name, kwargs, result)


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(sorted(COST)), data=st.data())
def test_cost_bad_value_is_named(name, data):
    """One argument bad, the others valid: a ValueError or TypeError naming that argument."""
    fn, args = COST[name]
    kwargs = {a: data.draw(kind_of(spec)[0], label=a) for a, spec in args.items()}
    bad = data.draw(st.sampled_from(sorted(args)), label="bad argument")
    kwargs[bad] = data.draw(kind_of(args[bad])[1], label="bad value")
    with pytest.raises((ValueError, TypeError)) as info:
        fn(**kwargs)
    message = str(info.value)
    assert bad in message or repr(kwargs[bad]) in message, (name, bad, kwargs[bad], message)


@PURE_SETTINGS
@given(algorithm=st.sampled_from(["naive", "tree", "ring", "halving_doubling"]), p=st.integers(1, 64),
       values=st.lists(_finite(0, 1e6), min_size=4, max_size=4), which=st.integers(0, 3), more=_finite(0, 1e6))
def test_allreduce_time_never_falls_as_bytes_or_link_costs_grow(algorithm, p, values, which, more):
    """T(n, alpha, beta, gamma) is a sum of non-negative multiples of each: non-decreasing in every one."""
    nbytes, alpha, beta, gamma = values
    before = allreduce_time(algorithm, nbytes, p, alpha * 1e-6, beta * 1e-12, gamma * 1e-12)
    values = list(values)
    values[which] += more
    nbytes, alpha, beta, gamma = values
    after = allreduce_time(algorithm, nbytes, p, alpha * 1e-6, beta * 1e-12, gamma * 1e-12)
    assert after >= before * (1 - 1e-12)


@PURE_SETTINGS
@given(algorithm=st.sampled_from(["naive", "tree", "ring"]), p=st.integers(1, 200), nbytes=_finite(0, 1e10))
def test_allreduce_time_never_falls_with_more_ranks(algorithm, p, nbytes):
    """naive 2(p-1), tree 2 ceil(lg p), ring 2(p-1) messages and (p-1)/p of the bytes: all
    non-decreasing in p (halving-doubling is not: p = 5 pays a fold that p = 8 does not)."""
    assert allreduce_time(algorithm, nbytes, p + 1, 1e-5, 1e-9, 1e-10) >= allreduce_time(
        algorithm, nbytes, p, 1e-5, 1e-9, 1e-10) * (1 - 1e-12)


@PURE_SETTINGS
@given(p=st.integers(1, 64), m=st.integers(1, 64), v=st.integers(1, 8))
def test_bubble_is_a_fraction_that_falls_with_microbatches_and_chunks(p, m, v):
    b = pipeline_bubble_fraction(p, m)
    assert 0 <= b < 1 and pipeline_bubble_fraction(p, m + 1) <= b <= pipeline_bubble_fraction(p + 1, m)
    assert interleaved_bubble_fraction(p, m, v) <= b and interleaved_bubble_fraction(p, m, 1) == b


@PURE_SETTINGS
@given(alpha=st.one_of(st.just(0.0), _finite(1e-9, 1e-3)), beta=st.one_of(st.just(0.0), _finite(1e-13, 1e-8)),
       sizes=st.lists(st.integers(0, 1 << 30), min_size=2, max_size=8, unique=True), relative=st.booleans())
def test_fit_alpha_beta_fits_exact_data(alpha, beta, sizes, relative):
    """Times on a line t = alpha + n beta (seconds of real messages): the fit is finite,
    non-negative and goes through every point (alpha, beta themselves are not always
    identifiable: beta n may be below alpha's rounding)."""
    if alpha == 0 and (beta == 0 or 0 in sizes):
        alpha = 1e-6              # times must be > 0
    times = [alpha + n * beta for n in sizes]
    a, b = fit_alpha_beta(sizes, times, relative=relative)
    assert a >= 0 and b >= 0 and math.isfinite(a) and math.isfinite(b)
    for n, t in zip(sizes, times):
        assert a + n * b == pytest.approx(t, rel=1e-6), (a, b, n, t)


@PURE_SETTINGS
@given(which=st.sampled_from(["sizes_bytes", "times_s"]), index=st.integers(0, 2),
       bad=st.one_of(NONFINITE, _finite(-1e9, -1e-9), st.sampled_from(["4k", None, [1], 1j])))
def test_fit_alpha_beta_bad_value_is_named(which, index, bad):
    sizes, times = [1000, 2000, 4000], [1e-5, 2e-5, 4e-5]
    (sizes if which == "sizes_bytes" else times)[index] = bad
    with pytest.raises((ValueError, TypeError)) as info:
        fit_alpha_beta(sizes, times)
    assert which.split("_")[0] in str(info.value), str(info.value)


@PURE_SETTINGS
@given(times=st.lists(st.one_of(_finite(0, 1e3), NONFINITE, _finite(-1e3, -1e-9), st.sampled_from(["1", None])),
                      max_size=5))
def test_sequential_idle_fractions(times):
    ok = (times and all(isinstance(t, float) and math.isfinite(t) and t >= 0 for t in times) and sum(times) > 0)
    if not ok:
        with pytest.raises((ValueError, TypeError), match="stage_times"):
            sequential_idle_fractions(times)
        return
    idle = sequential_idle_fractions(times)
    assert all(0 <= f <= 1 for f in idle) and sum(idle) == pytest.approx(len(times) - 1)


# ================================================================ process grid
ints_or_not = st.one_of(st.integers(-3, 9), st.sampled_from([2.0, 1.5, "2", None, True, False, [2], math.nan]))


def grid_rule_broken(dp, pp, tp, world_size, rank):
    def is_int(v):
        return isinstance(v, int) and not isinstance(v, bool)

    if not all(is_int(v) and v >= 1 for v in (dp, pp, tp)):
        return "factors"
    if world_size is None:                     # torch.distributed's, and it is not initialized here
        return "world_size needed"
    if not (is_int(world_size) and world_size >= 1):
        return "world_size"
    if dp * pp * tp != world_size:
        return "product"
    if rank is not None and not (is_int(rank) and 0 <= rank < world_size):     # None: rank 0
        return "rank"
    return None


@settings(max_examples=300, deadline=None)
@given(dp=ints_or_not, pp=ints_or_not, tp=ints_or_not, world_size=ints_or_not, rank=ints_or_not)
def test_grid_bad_sizes_list_every_factor(dp, pp, tp, world_size, rank):
    broken = grid_rule_broken(dp, pp, tp, world_size, rank)
    if broken is None:
        grid = ProcessGrid(dp=dp, pp=pp, tp=tp, world_size=world_size, rank=rank)
        assert all(isinstance(c, int) for c in grid.coords())
        assert grid.rank_of(**grid.coords()._asdict()) == (rank or 0)
        return
    with pytest.raises((ValueError, TypeError)) as info:
        ProcessGrid(dp=dp, pp=pp, tp=tp, world_size=world_size, rank=rank)
    message = str(info.value)
    if broken == "factors":
        assert f"dp={dp!r}" in message and f"pp={pp!r}" in message and f"tp={tp!r}" in message, message
    elif broken == "world_size needed":
        assert "world_size is needed" in message, message
    elif broken == "product":
        assert f"dp({dp}) * pp({pp}) * tp({tp}) != world_size({world_size})" in message, message
    else:
        assert f"{broken}({locals()[broken]!r})" in message or f"{broken}={locals()[broken]!r}" in message, message


@PURE_SETTINGS
@given(dp=st.integers(1, 3), pp=st.integers(1, 3), tp=st.integers(1, 3), axis=st.sampled_from(["dp", "pp", "tp"]),
       bad=st.one_of(st.integers(-5, -1), st.integers(27, 100), st.sampled_from([1.0, "1", True, [0]])))
def test_grid_lookups_name_the_bad_value(dp, pp, tp, axis, bad):
    """coords / ranks / rank_of with a rank or coordinate that is not one: a clear error,
    never a float coordinate or a TypeError from deep inside."""
    grid = ProcessGrid(dp=dp, pp=pp, tp=tp, world_size=dp * pp * tp, rank=0)
    for call in (lambda: grid.coords(bad), lambda: grid.ranks(axis, bad), lambda: grid.rank_of(**{axis: bad})):
        with pytest.raises((ValueError, TypeError)) as info:
            call()
        assert repr(bad) in str(info.value), str(info.value)
