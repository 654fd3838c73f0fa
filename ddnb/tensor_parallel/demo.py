"""The harnesses of `notebooks/10_tensor_parallelism.ipynb`: each runs on every rank at
once, on the tensor-parallel group of ranks [0, t) (every rank calls `dist.new_group`, as
it must; ranks >= t return None), and returns plain numbers the notebook prints.

    check_against_reference(t, cfg)   MLP, attention, block and GPT against the unsharded
                                      model: forward and every parameter's gradient
    traced_step(t, cfg, what)         the collectives of one block's / the GPT's step, counted
    cross_entropies(t, V, N)          vocab-parallel and gathered cross-entropy against F.cross_entropy
    measure_memory(t, cfg)            parameters, gradients, optimizer, activations per rank
    held_shapes(t, cfg, what)         the shape of every parameter this rank holds of layer 1's MLP,
                                      attention or block
    against_torch(t, cfg, reps)       TensorParallelMLP against torch's ColwiseParallel / RowwiseParallel

The layers follow Megatron-LM (Shoeybi et al. 2019, arXiv 1909.08053, Sec. 3): per block
two all-reduces of (B, T, d) in forward (g) and two in backward (f).
"""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ddnb._checks import Checks
from ddnb.models import GPTConfig, gpt, lm_loss, synthetic_task
from ddnb.tensor_parallel.comms import count_collectives
from ddnb.tensor_parallel.embedding import gathered_cross_entropy, vocab_parallel_cross_entropy
from ddnb.tensor_parallel.transformer import (TensorParallelAttention, TensorParallelBlock, TensorParallelGPT,
                                              TensorParallelMLP)
from ddnb.trace import Tracer


def _check_t(check: Checks, t) -> bool:
    return check.integer("t", t, min=1, max=dist.get_world_size())


def _group_of_first(t: int):
    """The group of ranks [0, t), created on every rank; None on the ranks outside it."""
    group = dist.new_group(list(range(t)))
    return group if dist.get_rank() < t else None


def _grads_as_module(m):
    """A copy of m whose parameters hold m's gradients (so they can be sharded like weights)."""
    g = copy.deepcopy(m)
    with torch.no_grad():
        for p, q in zip(m.parameters(), g.parameters()):
            q.copy_(p.grad)
    return g


def _grad_error(tp, build, ref) -> float:
    """Largest difference of tp's gradients from ref's, sharded by the same `build`."""
    expected = dict(build(_grads_as_module(ref)).named_parameters())
    return max((p.grad - expected[n]).abs().max().item() for n, p in tp.named_parameters())


def check_against_reference(t: int, cfg: GPTConfig) -> dict | None:
    """The MLP, attention and block of layer 1 of `gpt(cfg, seed=0)`, and the whole GPT,
    each built `from_module(reference, group)` on ranks [0, t) and run on the same input as
    the reference (loss: sum of squares; the GPT: its vocab-parallel cross-entropy).
    Returns {name: (largest forward difference, largest gradient difference)}."""
    with Checks("check_against_reference") as check:
        _check_t(check, t)
    group = _group_of_first(t)
    if group is None:
        return None
    ref_model = gpt(cfg, seed=0)
    idx, targets = synthetic_task(cfg, batch_size=4, steps=1)[0]
    out = {}
    x = torch.randn(4, cfg.seq_len, cfg.d_model, generator=torch.Generator().manual_seed(1))   # (B, T, d)
    for name, ref, cls in [("MLP", ref_model[1].mlp, TensorParallelMLP),
                           ("attention", ref_model[1].attn, TensorParallelAttention),
                           ("block", ref_model[1], TensorParallelBlock)]:
        ref.zero_grad()
        build = lambda m, cls=cls: cls.from_module(m, group)
        tp = build(ref)
        y_ref, y = ref(x), tp(x)
        (y_ref ** 2).sum().backward(); (y ** 2).sum().backward()
        out[name] = ((y - y_ref).abs().max().item(), _grad_error(tp, build, ref))
    ref_model.zero_grad()
    build = lambda m: TensorParallelGPT.from_module(m, group)
    tp = build(ref_model)
    loss_ref, loss = lm_loss(ref_model(idx), targets), tp.loss(idx, targets)
    loss_ref.backward(); loss.backward()
    out["GPT loss"] = (abs(loss.item() - loss_ref.item()), _grad_error(tp, build, ref_model))
    return out


def traced_step(t: int, cfg: GPTConfig, what: str) -> tuple | None:
    """One forward and backward of a tensor-parallel block (`what="block"`, loss: sum of
    squares) or of the whole GPT (`what="GPT"`, its loss) on ranks [0, t), traced.
    Returns (count_collectives(events), {phase: bytes this rank all-reduced}, events)."""
    with Checks("traced_step") as check:
        _check_t(check, t)
        check.choice("what", what, ["block", "GPT"])
    group = _group_of_first(t)
    if group is None:
        return None
    tracer = Tracer()
    idx, targets = synthetic_task(cfg, batch_size=4, steps=1)[0]
    dist.barrier(group)                                  # start together, for the timeline
    if what == "block":
        block = TensorParallelBlock.from_module(gpt(cfg)[1], group, tracer)
        with tracer.span("compute", "forward"):
            y = block(torch.randn(4, cfg.seq_len, cfg.d_model, generator=torch.Generator().manual_seed(0)))
        with tracer.span("compute", "backward"):
            y.square().sum().backward()
    else:
        model = TensorParallelGPT.from_module(gpt(cfg), group, tracer)
        with tracer.span("compute", "forward"):
            loss = model.loss(idx, targets)
        with tracer.span("compute", "backward"):
            loss.backward()
    events = tracer.take()
    nbytes = {}
    for e in events:
        if e["kind"] == "collective":
            nbytes[e["phase"]] = nbytes.get(e["phase"], 0) + e["nbytes"]
    return count_collectives(events), nbytes, events


def cross_entropies(t: int, V: int = 4096, N: int = 64) -> dict | None:
    """Random logits (N, V) and targets; each of ranks [0, t) holds the logits of its V/t
    words. Returns {"vocab-parallel" | "gathered": (loss equal to F.cross_entropy on the
    full logits (1e-5), gradient of my shard equal (1e-5), collectives, bytes sent)}."""
    with Checks("cross_entropies") as check:
        ok = _check_t(check, t) & check.positive_ints(V=V, N=N)
        check.rule(not ok or V % t == 0, f"V={V} must be a multiple of t={t}")
    group = _group_of_first(t)
    if group is None:
        return None
    g = torch.Generator().manual_seed(0)
    logits, targets = torch.randn(N, V, generator=g) * 4, torch.randint(0, V, (N,), generator=g)   # (N, V), (N,)
    full = logits.clone().requires_grad_()
    ref = F.cross_entropy(full, targets)
    ref.backward()
    r, n = dist.get_rank(group), V // t
    out = {}
    for name, fn in [("vocab-parallel", vocab_parallel_cross_entropy), ("gathered", gathered_cross_entropy)]:
        tracer = Tracer()
        mine = logits[:, r * n:(r + 1) * n].clone().requires_grad_()         # (N, V/t)
        loss = fn(mine, targets, group, tracer=tracer)
        loss.backward()
        ev = tracer.take()
        out[name] = (abs(loss.item() - ref.item()) < 1e-5,
                     (mine.grad - full.grad[:, r * n:(r + 1) * n]).abs().max().item() < 1e-5,
                     count_collectives(ev), sum(e["nbytes"] for e in ev))
    return out


def measure_memory(t: int, cfg: GPTConfig) -> tuple | None:
    """One Adam step of `TensorParallelGPT` (from `gpt(cfg)`) on ranks [0, t), batch of 4.
    Returns ({parameters, gradients, optimizer, activations: bytes on this rank},
    {phase: bytes this rank all-reduced})."""
    from ddnb.memory import SavedActivations, model_memory

    with Checks("measure_memory") as check:
        _check_t(check, t)
    group = _group_of_first(t)
    if group is None:
        return None
    tracer = Tracer()
    model = TensorParallelGPT.from_module(gpt(cfg), group, tracer)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    idx, targets = synthetic_task(cfg, batch_size=4, steps=1)[0]
    with SavedActivations() as act:
        loss = model.loss(idx, targets)
        loss.backward()
    opt.step()
    traffic = {}
    for e in tracer.take():
        traffic[e["phase"]] = traffic.get(e["phase"], 0) + e["nbytes"]
    return {**model_memory(model, opt), "activations": act.peak}, traffic


def held_shapes(t: int, cfg: GPTConfig, what: str = "MLP") -> dict | None:
    """The shape of every parameter this rank really holds of layer 1 of `gpt(cfg, seed=0)`
    when its MLP, attention or block (`what`) is built `from_module(reference, group)` on
    ranks [0, t): {name: shape tuple}, e.g. for the MLP fc.weight (4d/t, d) (column split),
    proj.weight (d, 4d/t) (row split), fc.bias (4d/t,) and proj.bias (d,), replicated
    (Shoeybi et al. 2019, Sec. 3, Eq. 3). Read by exercise 10.3, which counts the weight
    elements of a rank from these shapes."""
    with Checks("held_shapes") as check:
        _check_t(check, t)
        check.choice("what", what, ["MLP", "attention", "block"])
    group = _group_of_first(t)
    if group is None:
        return None
    ref = gpt(cfg, seed=0)[1]
    module, cls = {"MLP": (ref.mlp, TensorParallelMLP), "attention": (ref.attn, TensorParallelAttention),
                   "block": (ref, TensorParallelBlock)}[what]
    return {name: tuple(p.shape) for name, p in cls.from_module(module, group).named_parameters()}


def against_torch(t: int, cfg: GPTConfig, reps: int = 0) -> tuple | None:
    """The MLP of layer 1 of `gpt(cfg)` as `TensorParallelMLP` and as torch's
    (`torch_tp_mlp`) on ranks [0, t), on the same input (8, T, d), loss sum of squares.
    Returns ({forward, input grad, weight grads: equal within 1e-5}, {ddnb, torch: median
    seconds of `reps` forward+backward passes, None when reps=0})."""
    import time
    from ddnb.tensor_parallel.torch_tp import local_grads, torch_tp_mlp

    with Checks("against_torch") as check:
        _check_t(check, t)
        check.integer("reps", reps, min=0)
    group = _group_of_first(t)
    if group is None:
        return None
    mlp = gpt(cfg)[1].mlp
    ours, theirs = TensorParallelMLP.from_module(mlp, group), torch_tp_mlp(mlp, group)
    x = torch.randn(8, cfg.seq_len, cfg.d_model, generator=torch.Generator().manual_seed(0))   # (8, T, d)
    xo, xt = x.clone().requires_grad_(), x.clone().requires_grad_()
    yo, yt = ours(xo), theirs(xt)
    yo.square().sum().backward(); yt.square().sum().backward()
    mine, torchs = dict(ours.named_parameters()), local_grads(theirs)
    out = {"forward": (yo - yt).abs().max().item() < 1e-5, "input grad": (xo.grad - xt.grad).abs().max().item() < 1e-5,
           "weight grads": max((mine[n].grad - g).abs().max().item() for n, g in torchs.items()) < 1e-5}
    times = {}
    for name, m in (("ddnb", ours), ("torch", theirs)):
        ts = []
        for _ in range(reps):
            dist.barrier(group)
            start = time.perf_counter()
            m(x).square().sum().backward()
            ts.append(time.perf_counter() - start)
        times[name] = sorted(ts)[len(ts) // 2] if ts else None
    return out, times
