"""What runs on a rank around a learner's function: the collectives that would be the
shortcut are switched off, and every byte the rank sends point to point is counted.

    blob = ship(fn)                                      # on the driver: fn by value
    ...                                                  # on the rank:
    with refuse_collectives(allow=("all_gather",), why="...") as wire:
        out = land(blob)(x)                              # land inside: imports resolve to refusals
    return out, wire.sent_bytes

Refused (each raises `Refused`, "dist.all_reduce is off in this exercise: <why>"):
torch.distributed's collectives (`COLLECTIVES`, those this torch has), in both
`torch.distributed` and `torch.distributed.distributed_c10d`, and ddnb's own (`LIBRARY`)
in every ddnb module that holds them. An exercise that asks for a ring all-reduce from
isend / irecv is otherwise passed by `dist.all_reduce`: the sum is the same, the
learning is not. Names in `allow` pass through and the elements handed to them are
counted (`wire.handed`). Every name is put back on exit, also after a raise.

Counted: `dist.send`, `dist.isend`, and the isend ops of `dist.batch_isend_irecv`, once
each at the outermost call (send and batch_isend_irecv call isend inside), as
numel · element_size per destination (`wire.sent_to`, `wire.messages`); receives are
not counted. The bytes tell the algorithm, not only the result: a ring all-reduce sends
2(N-1) chunks of S/N per rank (Patarasuk & Yuan 2009), a gather to one rank and back
sends (N-1)·S from that rank; a checker compares them. A collective run without going
through these names (a ProcessGroup method, functional collectives) is not refused, and
is caught by those counts: it sends nothing the checker sees.

`ship` pickles a learner's function by value (cloudpickle) unless it is ddnb's own, so
`land` on the rank builds it afresh each run, with fresh copies of its globals: state it
kept in a global or a closure does not survive from one run to the next. `held_outside`
lists what it keeps there. Used by the checkers of `ddnb.exercises` (collectives, p2p,
decentralized, compression, sharding), from `notebooks/03_collectives.ipynb` on.
"""
from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import sys
import types
from dataclasses import dataclass, field

COLLECTIVES = ("all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "all_gather_object",
               "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "gather", "scatter",
               "_all_gather_base", "_reduce_scatter_base", "all_gather_single", "reduce_scatter_single",
               "all_reduce_coalesced", "all_gather_coalesced", "broadcast_object_list", "gather_object",
               "scatter_object_list")
ALL_GATHERS = ("all_gather", "all_gather_into_tensor", "_all_gather_base", "all_gather_single")
LIBRARY = ("ddnb.collectives.naive_allreduce", "ddnb.collectives.tree_allreduce", "ddnb.collectives.ring_allreduce",
           "ddnb.collectives.halving_doubling_allreduce", "ddnb.collectives.ring_reduce_scatter",
           "ddnb.collectives.ring_allgather", "ddnb.collectives.reduce", "ddnb.collectives.broadcast",
           "ddnb.collectives.all_to_all", "ddnb.collectives.bruck_all_to_all", "ddnb.decentralized.gossip",
           "ddnb.decentralized.start_gossip", "ddnb.compression.topk.topk_compress",
           "ddnb.compression.topk.topk_decompress", "ddnb.compression.topk_hook")
# the argument a collective's own contribution is in (counted in wire.handed for allowed ones)
_INPUT_ARG = {"all_reduce": 0, "reduce": 0, "broadcast": 0, "gather": 0, "all_reduce_coalesced": 0}
_NAMESPACES = ("torch.distributed", "torch.distributed.distributed_c10d")


class Refused(RuntimeError):
    """A refused collective was called on a rank."""


@dataclass
class Wire:
    """What one rank sent while guarded: p2p bytes per destination rank and messages per
    destination (receives not counted); `handed` {allowed collective: elements handed
    to it}, `handed_bytes` the same in bytes. Plain data: it travels back to the driver."""

    sent_to: dict = field(default_factory=dict)
    messages: dict = field(default_factory=dict)
    handed: dict = field(default_factory=dict)
    handed_bytes: dict = field(default_factory=dict)
    depth: int = 0                     # >0 inside a counted call: inner calls are not counted again

    @property
    def sent_bytes(self) -> int:
        return sum(self.sent_to.values())

    def sent(self, tensor, dst) -> None:
        self.sent_to[dst] = self.sent_to.get(dst, 0) + _nbytes(tensor)
        self.messages[dst] = self.messages.get(dst, 0) + 1


def _tensors(obj) -> list:
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _tensors(o)]
    return []


def _nbytes(obj) -> int:
    return sum(t.numel() * t.element_size() for t in _tensors(obj))


def _counted(fn, wire: Wire, count):
    """fn, with count(*args, **kwargs) run first when it is the outermost counted call."""
    def wrapper(*args, **kwargs):
        if wire.depth == 0:
            count(*args, **kwargs)
        wire.depth += 1
        try:
            return fn(*args, **kwargs)
        finally:
            wire.depth -= 1
    wrapper.__name__, wrapper.__qualname__, wrapper.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
    wrapper.__wrapped__ = fn
    return wrapper


def _refusal(label: str, why: str, name: str):
    def refused(*args, **kwargs):
        raise Refused(f"{label} is off in this exercise: {why}")
    refused.__name__ = refused.__qualname__ = name
    return refused


def _p2p_counters(wire: Wire, isend):
    """Counting functions for send / isend (tensor, dst, ...) and batch_isend_irecv."""
    def one(tensor=None, dst=None, group=None, tag=0, group_dst=None, *rest, **kw):
        wire.sent(tensor, dst if dst is not None else group_dst)

    def batch(ops, *rest, **kw):
        for op in ops:
            if getattr(op.op, "__name__", "") == "isend" or op.op is isend:
                wire.sent(op.tensor, getattr(op, "peer", None))
    return one, batch


def _handed_counter(wire: Wire, name: str, fn):
    params = list(inspect.signature(fn).parameters)
    arg = params[_INPUT_ARG.get(name, 1)]

    def count(*args, **kwargs):
        bound = dict(zip(params, args), **kwargs)
        tensors = _tensors(bound.get(arg))
        wire.handed[name] = wire.handed.get(name, 0) + sum(t.numel() for t in tensors)
        wire.handed_bytes[name] = wire.handed_bytes.get(name, 0) + _nbytes(tensors)
    return count


def _library_objects(names) -> dict:
    """{id(object): (object, public name)} of ddnb's library functions named in `names`."""
    out = {}
    for dotted in names:
        module, _, attr = dotted.rpartition(".")
        obj = getattr(importlib.import_module(module), attr)
        out[id(obj)] = (obj, dotted)
    return out


def _holders(objects: dict) -> list:
    """(module or dict, key, object) for every place a ddnb module holds one of `objects`
    ({id: (object, ...)}): its attributes, and the values of its dicts (a registry such
    as ddnb.collectives.ALLREDUCES)."""
    out = []
    for modname, module in list(sys.modules.items()):
        if module is None or not (modname == "ddnb" or modname.startswith("ddnb.")):
            continue
        for attr, value in list(vars(module).items()):
            if id(value) in objects and objects[id(value)][0] is value:
                out.append((module, attr, value))
            elif isinstance(value, dict):
                out += [(value, k, v) for k, v in list(value.items())
                        if id(v) in objects and objects[id(v)][0] is v]
    return out


def _put(container, key, value) -> None:
    if isinstance(container, dict):
        container[key] = value
    else:
        setattr(container, key, value)


@contextlib.contextmanager
def refuse_collectives(allow=(), why: str = "build it from isend/irecv, that is the exercise",
                       library=LIBRARY):
    """On a rank: while inside, torch.distributed's collectives but those in `allow`
    (names from COLLECTIVES) and ddnb's functions named in `library` raise `Refused` with
    `why`; p2p sends and what allowed collectives are handed are counted in the yielded
    `Wire`. Restores every name on exit, also when the body raised."""
    unknown = [a for a in allow if a not in COLLECTIVES]
    if unknown:
        raise ValueError(f"refuse_collectives: allow={tuple(allow)!r}: {unknown} are not among {COLLECTIVES}")
    namespaces = [importlib.import_module(n) for n in _NAMESPACES]
    c10d = namespaces[1]
    wire, patched = Wire(), []                   # patched: (namespace, name, original)

    def patch(name: str, make) -> None:
        originals = {id(getattr(ns, name)): getattr(ns, name) for ns in namespaces if hasattr(ns, name)}
        replacement = {i: make(orig) for i, orig in originals.items()}
        for ns in namespaces:
            if hasattr(ns, name):
                orig = getattr(ns, name)
                patched.append((ns, name, orig))
                setattr(ns, name, replacement[id(orig)])

    try:
        for name in COLLECTIVES:
            if name in allow:
                patch(name, lambda orig, name=name: _counted(orig, wire, _handed_counter(wire, name, orig)))
            else:
                patch(name, lambda orig, name=name: _refusal(f"dist.{name}", why, name))
        one, batch = _p2p_counters(wire, c10d.isend)
        for name in ("send", "isend"):
            patch(name, lambda orig: _counted(orig, wire, one))
        patch("batch_isend_irecv", lambda orig: _counted(orig, wire, batch))
        refused = {i: (obj, _refusal(label, why, getattr(obj, "__name__", label)))
                   for i, (obj, label) in _library_objects(library).items()}
        for container, key, value in _holders(refused):
            patched.append((container, key, value))
            _put(container, key, refused[id(value)][1])
        yield wire
    finally:
        for container, name, orig in reversed(patched):
            _put(container, name, orig)
        wire.depth = 0


def _by_value(module) -> bool:
    """Whether a function of `module` travels by value: the learner's modules (a test file,
    a script, ddnb's solutions), not ddnb's library nor an installed package."""
    name = module.__name__
    if name == "__main__" or name.startswith("ddnb.exercises.solutions"):
        return name != "__main__"             # __main__ travels by value already
    path = os.path.realpath(getattr(module, "__file__", None) or "")
    ddnb_dir = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    return bool(path) and not path.startswith(ddnb_dir + os.sep) and not any(
        part in path.split(os.sep) for part in ("site-packages", "dist-packages")) and not path.startswith(
        os.path.realpath(sys.base_prefix) + os.sep)


def ship(fn) -> bytes:
    """fn pickled for `land`: by value when it is the learner's (see `_by_value`), so each
    landing is a fresh function with fresh copies of the globals it names."""
    import cloudpickle

    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    register = (isinstance(fn, types.FunctionType) and module is not None and _by_value(module)
                and module.__name__ not in cloudpickle.list_registry_pickle_by_value())
    if register:
        cloudpickle.register_pickle_by_value(module)
    try:
        return cloudpickle.dumps(fn)
    finally:
        if register:
            cloudpickle.unregister_pickle_by_value(module)


def land(blob: bytes):
    """The function `ship` pickled, built now (call it inside `refuse_collectives`: a
    library function it names is looked up now, and is then the refusal)."""
    import cloudpickle

    return cloudpickle.loads(blob)


def _named(fn) -> dict:
    """{where: object} of what fn can keep between calls: the globals its code names
    (nested code too), its closure cells, defaults and attributes."""
    out = {}
    codes = [getattr(fn, "__code__", None)]
    while codes:
        code = codes.pop()
        if code is None:
            continue
        for name in code.co_names:
            if name in getattr(fn, "__globals__", {}):
                out[f"global {name!r}"] = fn.__globals__[name]
        codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    for name, cell in zip(getattr(getattr(fn, "__code__", None), "co_freevars", ()), fn.__closure__ or ()):
        with contextlib.suppress(ValueError):
            out[f"closure variable {name!r}"] = cell.cell_contents
    defaults, code = getattr(fn, "__defaults__", None) or (), getattr(fn, "__code__", None)
    names = code.co_varnames[:code.co_argcount][-len(defaults):] if code is not None and defaults else ()
    out.update({f"default argument {k!r}": v for k, v in zip(names, defaults)})
    out.update({f"default argument {k!r}": v for k, v in (getattr(fn, "__kwdefaults__", None) or {}).items()})
    out.update({f"attribute {k!r}": v for k, v in getattr(fn, "__dict__", {}).items()})
    return out


def _fingerprint(obj, depth: int = 3) -> tuple[int, float]:
    """(elements, sum) of the tensors reachable from obj through containers and plain
    objects' attributes (not modules, functions or classes), `depth` levels deep."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.numel(), float(obj.detach().double().nan_to_num().sum()) if obj.numel() else 0.0
    if depth == 0 or isinstance(obj, (types.ModuleType, types.FunctionType, type, str, bytes)):
        return 0, 0.0
    if isinstance(obj, dict):
        items = list(obj.values())
    elif isinstance(obj, (list, tuple, set, frozenset)):
        items = list(obj)
    elif isinstance(obj, torch.optim.Optimizer):
        items = list(obj.state.values())
    else:
        items = list(getattr(obj, "__dict__", {}).values())
    parts = [_fingerprint(o, depth - 1) for o in items]
    return sum(p[0] for p in parts), sum(p[1] for p in parts)


def held_outside(fn) -> dict:
    """{where: (elements, sum)} of the tensors fn can reach outside its arguments (modules,
    functions and classes it names left out): take it before and after a call; what
    changed was kept (or changed) there by the call."""
    code = (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, type)
    return {where: _fingerprint(obj) for where, obj in _named(fn).items() if not isinstance(obj, code)}
