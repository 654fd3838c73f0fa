"""Memory as it happens: what one rank holds at each event of one training step.

`ddnb.memory` measures the four parts of training memory (Rajbhandari et al. 2020, "ZeRO",
Sec. 3: parameters Ψ, gradients Ψ, optimizer state KΨ, and the activations autograd saves)
once, at a peak. Here they are sampled *through* a step, on every rank, for each way of
dividing them among N ranks:

    dp      every rank the whole model; backward, all-reduce the gradients, Adam   4Ψ | 4Ψ | 8Ψ
    zero1   ddnb.sharding.ZeroStage1: Adam state sharded (Sec. 5.1)                 4Ψ | 4Ψ | 8Ψ/N
    zero2   ZeroStage2: + gradients reduce-scattered in backward (Sec. 5.2)        4Ψ | 4Ψ/N | 8Ψ/N
    zero3   ZeroStage3: + parameters gathered per layer on demand (Sec. 5.3)       4Ψ/N | 4Ψ/N | 8Ψ/N
    gpipe   one pipeline of N stages, m micro-batches, all F then all B (Huang et al. 2019):
            a stage holds its layers' states and, at the peak, m micro-batches of activations
    1f1b    the same stages under 1F1B (Narayanan et al. 2021, Sec. 2.2.1): at most p in flight
    tp      ddnb.tensor_parallel.TensorParallelGPT (Shoeybi et al. 2019): every matmul's
            weight split N ways, LayerNorms, position embedding and row-parallel biases whole

(fp32 here: 4-byte parameters and gradients, Adam's two moments K = 8; ZeRO pads each layer
to a multiple of N, `ddnb.sharding.expected_state_bytes` gives the exact bytes.)

The events: "start" (after a warm-up step and zero_grad: Adam's state exists, as in any
step but the first), "F i" after layer i's forward, "B i" when the gradient reaches layer
i's output (its backward is next), "backward", then the strategy's own: "all-reduce",
"reduce-scatter", "optimizer step", "all-gather"; a pipeline samples after each of its
schedule's actions ("F3": micro-batch 3's forward). Parameters, gradients and optimizer
state are the storages this rank's objects hold (`ddnb.memory.tensor_bytes`, each storage
once); activations are the `live` bytes of a `ddnb.memory.SavedActivations`, saved for backward.

    events = step_timeline("zero2")                       # on every rank: [(label, i, bytes), ...]
    per_rank = memory_timeline(cluster, "1f1b", workers=4)   # from the notebook
    expected_at_rest("zero2", GPTConfig(), 4)             # the last event's bytes, by formula

Drawn by `ddnb.viz.memory_timeline`. Taught in `notebooks/11_memory_sharding.ipynb`.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ddnb._checks import Checks
from ddnb.memory import SavedActivations, tensor_bytes
from ddnb.models import GPTConfig, gpt, lm_loss, synthetic_task
from ddnb.trace import Tracer

STRATEGIES = ("dp", "zero1", "zero2", "zero3", "gpipe", "1f1b", "tp")
PARTS = ("parameters", "gradients", "optimizer", "activations")


def validate(strategy, config: GPTConfig, world_size, batch_size, microbatches, check: Checks) -> None:
    """Every rule a strategy's step needs, added to `check` (so one ValueError lists them all)."""
    check.choice("strategy", strategy, STRATEGIES)
    if not check.positive_ints(world_size=world_size, batch_size=batch_size, microbatches=microbatches):
        return
    if strategy in ("dp", "zero1", "zero2", "zero3"):
        check.rule(batch_size % world_size == 0, f"batch_size({batch_size}) must be a multiple of "
                   f"world_size({world_size}): each rank takes batch_size / world_size rows")
    elif strategy in ("gpipe", "1f1b"):
        layers = config.n_layers + 2
        check.rule(world_size <= layers, f"world_size({world_size}) stages > the GPT's {layers} layers")
        check.rule(batch_size % microbatches == 0, f"microbatches({microbatches}) must divide "
                   f"batch_size({batch_size})")
    elif strategy == "tp":
        for what, size in (("vocab_size", config.vocab_size), ("n_heads", config.n_heads),
                           ("MLP hidden size", config.d_model * config.mlp_ratio)):
            check.rule(size % world_size == 0, f"tp: {what}({size}) must be divisible by world_size({world_size})")


class _Sampler:
    """Appends (label, index, bytes) for this rank, reading the four parts from `states()`
    (a function returning the parameter, gradient and optimizer-state tensors) and `act`."""

    def __init__(self, states, act: SavedActivations):
        self.states, self.act, self.events = states, act, []

    def __call__(self, label: str) -> None:
        params, grads, opt = self.states()
        self.events.append((label, len(self.events), {
            "parameters": tensor_bytes(params), "gradients": tensor_bytes(g for g in grads if g is not None),
            "optimizer": tensor_bytes(opt), "activations": self.act.live}))


def _adam_tensors(optimizer):
    """Adam's exp_avg and exp_avg_sq (the step counters left out, as in the paper's K)."""
    return [v for s in optimizer.state.values() for k, v in s.items() if k != "step" and torch.is_tensor(v)]


def _plain_states(params, optimizer):
    """states() of a module whose parameters sit whole in one torch optimizer (dp, tp, a stage)."""
    return lambda: (params, [p.grad for p in params], _adam_tensors(optimizer))


def _hook_layers(layers, sample) -> None:
    """Sample "F i" after each layer's forward and "B i" when its output's gradient arrives."""
    def after_forward(i):
        def hook(module, args, out):
            sample(f"F{i}")
            if torch.is_tensor(out) and out.requires_grad:
                out.register_hook(lambda grad: sample(f"B{i}"))
        return hook
    for i, layer in enumerate(layers):   # prepend: before ZeRO-3's hook frees the gathered layer
        layer.register_forward_hook(after_forward(i), prepend=True)


def step_timeline(strategy: str, config: GPTConfig | None = None, batch_size: int = 24, microbatches: int = 8,
                  lr: float = 1e-3, seed: int = 0, group=None, device=None) -> list[tuple[str, int, dict]]:
    """One Adam step of `gpt(config, seed)` under `strategy` on every rank of `group`, after
    one warm-up step; returns this rank's [(event label, index, {part: bytes})]. Every
    argument is checked before the first message (the same ValueError on every rank).
    `device`: default `ddnb.runtime.worker.rank_device()` (the rank's GPU under nccl, else CPU)."""
    from ddnb.collectives.devices import rank_device

    config = GPTConfig() if config is None else config
    world_size, rank = dist.get_world_size(group), dist.get_rank(group)
    with Checks("step_timeline") as check:
        validate(strategy, config, world_size, batch_size, microbatches, check)
        check.number("lr", lr, positive=True)
    device = rank_device() if device is None else torch.device(device)
    model = gpt(config, seed=seed).to(device)
    batches = [(x.to(device), y.to(device)) for x, y in synthetic_task(config, batch_size, steps=2, seed=seed)]
    # 2 x ((B, T), (B, T)) int64
    act = SavedActivations()
    if strategy in ("gpipe", "1f1b"):
        return _pipeline(strategy, model, batches, microbatches, lr, act, group, device)
    if strategy in ("dp", "zero1", "zero2", "zero3"):
        b = batch_size // world_size
        batches = [(x[rank * b:(rank + 1) * b], y[rank * b:(rank + 1) * b]) for x, y in batches]   # (b, T)
    if strategy == "tp":
        from ddnb.tensor_parallel import TensorParallelGPT

        net = TensorParallelGPT.from_module(model, group)
        layers, loss_of = [net.tok, *net.blocks, net.out], net.loss
        opt = torch.optim.Adam(net.parameters(), lr=lr, foreach=False)
        states = _plain_states(list(net.parameters()), opt)
        zero_grad = lambda: opt.zero_grad(set_to_none=True)                           # noqa: E731
        sync = [("optimizer step", opt.step)]                      # one TP group: nothing to all-reduce
    elif strategy == "dp":
        layers, loss_of = list(model), lambda x, y: lm_loss(model(x), y)              # noqa: E731
        opt = torch.optim.Adam(model.parameters(), lr=lr, foreach=False)
        states = _plain_states(list(model.parameters()), opt)
        zero_grad = lambda: opt.zero_grad(set_to_none=True)                           # noqa: E731

        def all_reduce():                                          # naive data parallelism
            for p in model.parameters():
                dist.all_reduce(p.grad, group=group)
                p.grad.div_(world_size)
        sync = [("all-reduce", all_reduce), ("optimizer step", opt.step)]
    else:
        from ddnb.sharding.compare import ZERO

        zero = ZERO[strategy](model, lr=lr, group=group)
        layers, loss_of = list(model), lambda x, y: lm_loss(zero(x), y)               # noqa: E731

        def states():
            params = [p for u in zero.units for p in u.params] + list(zero.shards)
            return params, [p.grad for p in params], _adam_tensors(zero.optimizer)
        zero_grad = zero.zero_grad
        # ZeroStage1.step's three moves, called one by one to sample between them
        sync = [("reduce-scatter", zero._reduce_gradients), ("optimizer step", zero.optimizer.step)]
        if strategy != "zero3":                                    # stage 3 gathers in the next forward
            sync.append(("all-gather", zero._gather_parameters))
    sample = _Sampler(states, act)
    for step, (x, y) in enumerate(batches):
        if step == 1:                                              # the warm-up step is not recorded
            zero_grad()
            sample("start")
            _hook_layers(layers, sample)
        with act:
            loss = loss_of(x, y)
        loss.backward()
        if step == 1:
            sample("backward")
        for label, fn in sync:
            with torch.no_grad():
                fn()
            if step == 1:
                sample(label)
    return sample.events


class _ActionTracer(Tracer):
    """A tracer that samples memory after every compute action of a pipeline schedule."""

    def __init__(self, sample=None):
        super().__init__(enabled=True)
        self.sample = sample

    def record(self, kind, name, start, end, peer=None, nbytes=0, **extra):
        super().record(kind, name, start, end, peer, nbytes, **extra)
        if kind == "compute" and self.sample is not None:
            self.sample(name)


def _pipeline(strategy, model, batches, microbatches, lr, act, group, device):
    from ddnb.pipeline_parallel import PipelineStage, get_schedule, run_schedule

    world_size = dist.get_world_size(group)
    tracer = _ActionTracer()
    x0 = batches[0][0]
    stage = PipelineStage(model, microbatches=microbatches, batch_shape=tuple(x0.shape), group=group, tracer=tracer,
                          device=device)
    params = list(stage.module.parameters())
    opt = torch.optim.Adam(params, lr=lr, foreach=False)
    sample = _Sampler(_plain_states(params, opt), act)
    schedule = get_schedule(strategy, world_size, microbatches)
    for step, (x, y) in enumerate(batches):
        if step == 1:
            opt.zero_grad(set_to_none=True)
            sample("start")
            tracer.sample = sample
        with act:
            run_schedule(stage, schedule, inputs=x if stage.is_first else None,
                         targets=y if stage.is_last else None, loss_fn=lm_loss, step=step)
        opt.step()
        if step == 1:
            sample("optimizer step")
    return sample.events


def _on_subgroup(strategy, workers, kwargs):
    """step_timeline on the first `workers` ranks (a new group of them); None on the others."""
    ranks = list(range(workers))
    group = None if workers == dist.get_world_size() else dist.new_group(ranks)   # every rank calls new_group
    if dist.get_rank() not in ranks:
        return None
    return step_timeline(strategy, group=group, **kwargs)


def memory_timeline(cluster, strategy: str, workers: int | None = None, config: GPTConfig | None = None,
                    batch_size: int = 24, microbatches: int = 8) -> list[list[tuple[str, int, dict]]]:
    """`step_timeline` on the first `workers` ranks of `cluster` (default: all of them);
    the list of events of each of those ranks, in rank order. Checked here first."""
    config = GPTConfig() if config is None else config
    workers = cluster.n if workers is None else workers
    with Checks("memory_timeline") as check:
        if check.integer("workers", workers, min=1, max=cluster.n):
            validate(strategy, config, workers, batch_size, microbatches, check)
        else:
            check.choice("strategy", strategy, STRATEGIES)
    out = cluster.run(_on_subgroup, strategy, workers,
                      dict(config=config, batch_size=batch_size, microbatches=microbatches))
    return out[:workers]


def expected_at_rest(strategy: str, config: GPTConfig | None = None, world_size: int = 1,
                     rank: int = 0) -> dict:
    """The parameters, gradients and Adam state rank `rank` holds after the step (the last
    event), by formula: `expected_state_bytes` for dp and ZeRO; 4·Ψ_s, 4·Ψ_s, 8·Ψ_s for the
    layers Ψ_s of a pipeline stage (`partition_layers`); for tp 4, 4 and 8 bytes per local
    element, Ψ_matmul / N + Ψ_replicated."""
    from ddnb.sharding import expected_state_bytes

    config = GPTConfig() if config is None else config
    with Checks("expected_at_rest") as check:
        validate(strategy, config, world_size, world_size, 1, check)
        check.integer("rank", rank, min=0, max=world_size - 1)
    model = gpt(config)
    unit_numels = [sum(p.numel() for p in m.parameters()) for m in model]
    if strategy in ("dp", "zero1", "zero2", "zero3"):
        stage = 0 if strategy == "dp" else int(strategy[-1])
        return expected_state_bytes(unit_numels, world_size, stage)
    if strategy in ("gpipe", "1f1b"):
        from ddnb.pipeline_parallel import partition_layers

        start, end = partition_layers(len(model), world_size)[rank]
        psi = sum(unit_numels[start:end])
    else:
        psi = sum(p.numel() // (1 if _replicated_in_tp(name) else world_size) for name, p in model.named_parameters())
    return {"parameters": 4 * psi, "gradients": 4 * psi, "optimizer": 8 * psi}


def _replicated_in_tp(name: str) -> bool:
    """Megatron keeps whole: LayerNorms, the position embedding, row-parallel biases (Sec. 3)."""
    return ("ln" in name or ".pos." in name or name.endswith("proj.bias"))
