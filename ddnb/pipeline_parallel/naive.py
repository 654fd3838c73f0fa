"""Naive model parallelism: the layers of one model split across ranks, run one after another.

Rank r holds layers [start_r, end_r) of an nn.Sequential (a *stage*). Forward, rank 0 runs
its layers on the input and sends the activation to rank 1, which runs its layers and sends
to rank 2, and so on; the last rank computes the loss. Backward goes the other way: each
rank receives dL/d(output) from rank + 1, back-propagates through its layers and sends
dL/d(input) to rank - 1. By the chain rule the gradients are exactly those of the unsplit
model, and each rank stores only its stage's parameters, gradients, optimizer state and
activations: ≈ 1/p of each with p balanced stages.

The price is time: the stages depend on each other, so only one rank computes at a time.
With stage times t_r, a step takes Σ t_r and rank r is idle for 1 - t_r / Σ t_r of it, on
average (p - 1)/p whatever the partition: the "bubble" that GPipe (Huang et al. 2019,
Sec. 2.2, Fig. 2b-c) fills by splitting the batch into micro-batches (notebook 09). This is
the inter-layer model parallelism of Krizhevsky 2014 ("One weird trick", Sec. 3) and
Dean et al. 2012 (DistBelief, Sec. 3); partitioning layers to balance stages follows
PipeDream (Narayanan et al. 2019, Sec. 3.1) and GPipe's `balance` argument.
Taught in `notebooks/08_model_parallelism.ipynb`.

    bounds = partition_layers(model, world_size, strategy="params")   # [(0, 2), (2, 3), (3, 4), (4, 6)]
    stage = NaiveModelParallel(model, bounds)                  # this rank's layers only
    opt = torch.optim.Adam(stage.parameters())
    loss = stage.forward_backward(idx, targets, lm_loss)       # a float on the last rank, else None
    opt.step()
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist
from torch import nn

from ddnb._checks import Checks, is_int
from ddnb.collectives import p2p
from ddnb.trace import Tracer, get_tracer

STRATEGIES = ("equal", "params", "time")


# --- partitioning ------------------------------------------------------------------------

def partition_layers(layers, stages: int, strategy: str = "equal", times=None) -> list[tuple[int, int]]:
    """Split `layers` (an nn.Sequential, a list of modules, or for "equal" just their count)
    into `stages` contiguous,
    non-empty slices [(start, end), ...] covering all of them.

    "equal": layer counts differ by at most one (the first stages take the extra layers).
    "params": the largest stage's parameter count is as small as possible.
    "time": the largest stage's total of `times` (per-layer seconds, e.g. from
    `measure_layer_times`) is as small as possible.
    The balanced strategies solve the linear partition problem exactly (dynamic programming
    over split points, O(L² p)); PipeDream, Sec. 3.1, does the same with profiled times."""
    count = layers if is_int(layers) else None              # a layer count: "equal" needs no more
    layers = range(max(count, 0)) if count is not None else list(layers)
    n, times = len(layers), None if times is None else list(times)
    with Checks("partition_layers") as check:
        check.choice("strategy", strategy, STRATEGIES)
        if count is not None:
            check.rule(strategy not in ("params", "time"),
                       f"strategy={strategy!r} needs the layers themselves, not a count ({count})")
            check.integer("layers", count, min=1)
        if check.integer("stages", stages, min=1) and (count is None or count >= 1):
            check.rule(stages <= n, f"more stages than layers: stages({stages}) > layers({n}): every stage needs "
                       f"at least one layer; use at most {n} stages or a model with more layers")
        if strategy == "time":
            _check_times(check, times, n)
        else:
            check.rule(times is None, f"times is only used by strategy='time', got strategy={strategy!r} with times")
    if strategy == "equal":
        sizes = [n // stages + (1 if s < n % stages else 0) for s in range(stages)]
        ends = [sum(sizes[:s + 1]) for s in range(stages)]
        return list(zip([0] + ends[:-1], ends))
    weights = ([sum(p.numel() for p in layer.parameters()) for layer in layers] if strategy == "params"
               else [float(t) for t in times])
    return balanced_partition(weights, stages)


def _check_times(check: Checks, times, n: int) -> None:
    """strategy="time"'s times: one finite number >= 0 per layer, added to `check`."""
    if check.rule(times is not None, "strategy='time' needs times: one measured time per layer "
                                     "(see measure_layer_times)"):
        if check.rule(len(times) == n, f"times has {len(times)} entries for {n} layers"):
            for i, t in enumerate(times):
                check.number(f"times[{i}]", t, min=0)


def balanced_partition(weights, stages: int) -> list[tuple[int, int]]:
    """Contiguous non-empty slices of `weights` into `stages` minimizing the largest slice sum.
    best[j][i]: the smallest possible maximum when the first i layers form j stages,
    best[j][i] = min_k max(best[j-1][k], Σ weights[k:i])."""
    n = len(weights)
    if not 1 <= stages <= n:
        raise ValueError(f"stages({stages}) must be between 1 and the number of layers({n})")
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    split = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for j in range(1, stages + 1):
        for i in range(j, n - (stages - j) + 1):
            for k in range(j - 1, i):
                cost = max(best[j - 1][k], prefix[i] - prefix[k])
                if cost < best[j][i]:
                    best[j][i], split[j][i] = cost, k
    bounds, i = [], n
    for j in range(stages, 0, -1):
        bounds.append((split[j][i], i))
        i = split[j][i]
    return bounds[::-1]


def stage_params(layers, bounds) -> list[int]:
    """Number of parameters in each stage."""
    layers = list(layers)
    return [sum(p.numel() for layer in layers[a:b] for p in layer.parameters()) for a, b in bounds]


def stage_totals(values, bounds) -> list[float]:
    """Sum of per-layer `values` (e.g. measured times) in each stage."""
    return [sum(values[a:b]) for a, b in bounds]


def imbalance(per_stage) -> float:
    """max / mean of per-stage loads: 1.0 is perfect balance; in a pipeline (notebook 09)
    the largest stage sets the rate, so this is the slowdown against a perfect split."""
    return max(per_stage) / (sum(per_stage) / len(per_stage))


def measure_layer_times(layers, inputs: torch.Tensor, repeats: int = 5) -> list[float]:
    """Median seconds of forward + backward of each layer on the input it sees in the full
    model (after one warm-up run), one process, no communication. The parameters' .grad
    are left None."""
    layers = list(layers)
    xs = [inputs]
    with torch.no_grad():
        for layer in layers[:-1]:
            xs.append(layer(xs[-1]))
    times = []
    for layer, x in zip(layers, xs):
        x = x.detach().requires_grad_(x.is_floating_point())
        samples = []
        for _ in range(repeats + 1):
            start = time.perf_counter()
            y = layer(x)
            y.backward(torch.ones_like(y))
            samples.append(time.perf_counter() - start)
        times.append(statistics.median(samples[1:]))
        layer.zero_grad(set_to_none=True)
    return times


def check_bounds(bounds, n_layers: int, world_size: int) -> list[tuple[int, int]]:
    """`bounds` must be world_size contiguous non-empty slices covering [0, n_layers)."""
    bounds = [tuple(b) for b in bounds]
    if world_size > n_layers:
        raise ValueError(f"world_size({world_size}) > layers({n_layers}): every rank needs at least one layer")
    if len(bounds) != world_size:
        raise ValueError(f"{len(bounds)} stages in bounds for world_size({world_size}): one stage per rank")
    problems = []
    if bounds[0][0] != 0:
        problems.append(f"the first stage starts at {bounds[0][0]}, not 0")
    if bounds[-1][1] != n_layers:
        problems.append(f"the last stage ends at {bounds[-1][1]}, not layers({n_layers})")
    problems += [f"stage {s} {b} is empty" for s, b in enumerate(bounds) if b[1] <= b[0]]
    problems += [f"stage {s} ends at {a[1]} but stage {s + 1} starts at {b[0]}"
                 for s, (a, b) in enumerate(zip(bounds, bounds[1:])) if a[1] != b[0]]
    if problems:
        raise ValueError(f"bounds {bounds} do not split {n_layers} layers into contiguous stages: "
                         + "; ".join(problems))
    return bounds


# --- communication: an activation and the shape it has ------------------------------------

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64)
MAX_DIMS = 6
HEADER = 2 + MAX_DIMS   # int64 entries: dtype code, ndim, shape padded with zeros


def send_activation(x: torch.Tensor, dst: int, group=None, tracer: Tracer | None = None) -> None:
    """Send a small header (dtype, shape; HEADER int64s), then the tensor itself, so the
    receiver can allocate the right buffer: a receive into a wrong-sized buffer would hang
    or fail. The gradient coming back has the shape the sender already knows."""
    if x.dtype not in DTYPES or x.dim() > MAX_DIMS:
        raise ValueError(f"cannot send an activation of dtype {x.dtype} with {x.dim()} dims: "
                         f"dtypes {DTYPES}, at most {MAX_DIMS} dims")
    header = torch.zeros(HEADER, dtype=torch.int64, device=x.device)
    header[0], header[1] = DTYPES.index(x.dtype), x.dim()
    header[2:2 + x.dim()] = torch.tensor(x.shape, dtype=torch.int64)
    p2p.send(header, dst, group=group, tracer=tracer, name="shape")
    p2p.send(x.contiguous(), dst, group=group, tracer=tracer, name="activation")


def recv_activation(src: int, device, group=None, tracer: Tracer | None = None) -> torch.Tensor:
    header = torch.zeros(HEADER, dtype=torch.int64, device=device)
    p2p.recv(header, src, group=group, tracer=tracer, name="shape")
    code, ndim, *shape = header.tolist()
    x = torch.empty(shape[:ndim], dtype=DTYPES[code], device=device)
    p2p.recv(x, src, group=group, tracer=tracer, name="activation")
    return x


# --- the stage ----------------------------------------------------------------------------

class NaiveModelParallel(nn.Module):
    """This rank's stage of `layers` (layers[start:end] for bounds[rank]), moved to `device`.

    Every rank builds the same full model (same seed) and keeps its slice; ranks are the
    ranks of `group`, stage s on rank s. Bounds are checked against the group before any
    message is sent, so a wrong configuration fails on every rank instead of blocking."""

    def __init__(self, layers, bounds, group=None, tracer: Tracer | None = None, device=None):
        super().__init__()
        layers = list(layers)
        self.group, self.tracer = group, tracer
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        self.bounds = check_bounds(bounds, len(layers), self.world_size)
        self.start, self.end = self.bounds[self.rank]
        self.layers = nn.Sequential(*layers[self.start:self.end])
        if device is not None:
            self.layers.to(device)
        self.device = torch.device(device) if device is not None else \
            next((p.device for p in self.layers.parameters()), torch.device("cpu"))

    @property
    def is_first(self) -> bool:
        return self.rank == 0

    @property
    def is_last(self) -> bool:
        return self.rank == self.world_size - 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """This stage's layers only, no communication."""
        return self.layers(x)

    def forward_backward(self, inputs: torch.Tensor, targets: torch.Tensor, loss_fn) -> float | None:
        """One training step's forward and backward through all stages, one after another.
        Rank 0 reads `inputs`, the last rank `targets` (the others ignore them). Gradients
        accumulate into this stage's parameters' .grad; returns the loss on the last rank,
        None on the others."""
        tr = get_tracer(self.tracer)
        # forward: receive the activation from the previous stage (or read the input) ...
        if self.is_first:
            x = inputs.to(self.device)
        else:
            x = recv_activation(self.rank - 1, self.device, self.group, tr)
            x.requires_grad_(x.is_floating_point())          # we will need dL/dx for rank - 1
        with tr.span("compute", "forward"):
            y = self.layers(x)                                # autograd saves this stage's activations
            loss = loss_fn(y, targets.to(self.device)) if self.is_last else None
        # ... and send ours to the next one, which runs while we wait
        if not self.is_last:
            send_activation(y.detach(), self.rank + 1, self.group, tr)
        # backward: the last stage starts from the loss, the others from the received dL/dy
        if self.is_last:
            with tr.span("compute", "backward"):
                loss.backward()
        else:
            grad = torch.empty_like(y)                        # dL/dy has the shape of y
            p2p.recv(grad, self.rank + 1, group=self.group, tracer=tr, name="gradient")
            with tr.span("compute", "backward"):
                y.backward(grad)
        if not self.is_first:
            p2p.send(x.grad, self.rank - 1, group=self.group, tracer=tr, name="gradient")
        return loss.item() if self.is_last else None


# --- reading the trace --------------------------------------------------------------------

def idle_fractions(events: list[dict], world_size: int | None = None) -> list[float]:
    """Per rank, the fraction of the traced window (first event start to last event end,
    over all ranks) that the rank spent outside "compute" events: waiting, sending and
    receiving. For naive model parallelism expect ≈ (p - 1)/p on average."""
    if not events:
        raise ValueError("no events: trace a step first")
    n = world_size if world_size is not None else 1 + max(e["rank"] for e in events)
    t0, t1 = min(e["start"] for e in events), max(e["end"] for e in events)
    busy = [0.0] * n
    for e in events:
        if e["kind"] == "compute":
            busy[e["rank"]] += e["end"] - e["start"]
    return [1.0 - b / (t1 - t0) for b in busy]


def bytes_by_name(events: list[dict], world_size: int | None = None) -> dict[str, list[int]]:
    """Bytes each rank sent, per message name ("activation", "gradient", "shape")."""
    n = world_size if world_size is not None else 1 + max((e["rank"] for e in events), default=-1)
    out: dict[str, list[int]] = {}
    for e in events:
        if e["kind"] == "send":
            out.setdefault(e["name"], [0] * n)[e["rank"]] += e["nbytes"]
    return out
