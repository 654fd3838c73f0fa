"""One layout of a GPT on many workers: its memory per worker and its predicted step time.

A layout puts dp × pp × tp × cp workers on a model (ranks ordered as `ddnb.process_grid`
orders them, tp fastest, then cp, dp, pp: Megatron-LM's "tp-cp-dp-pp"), with ZeRO stage
0-3 over the dp·cp ranks that hold the same parameters, activation checkpointing on or
off, and a global batch B cut into m = B / (dp·b) micro-batches of b sequences per
pipeline. Every formula is one ddnb.cost already has; this module composes them.

Memory of a worker (`layout_memory`; chapter 11's formulas), on the first and on the last
pipeline stage, the larger reported:
    states       zero_memory_parts(Ψ_w, dp·cp, zero) with Ψ_w = the stage's parameters / tp:
                 (L/pp) blocks + the embeddings (first stage) or the output projection
                 (last; tied, it is a copy of the token embedding, as Megatron keeps it)
    gathered     ZeRO-3 only: two blocks' parameters all-gathered at once (the running one and
                 the prefetched one, chapter 11's exercise 11.5)
    activations  in-flight micro-batches (`pipeline_activation_bytes`: min(pp - rank, m) for
                 1F1B, Megatron's interleaved count with v chunks) x the stage's bytes per
                 micro-batch. A layer keeps Korthikanti et al. 2022's bytes
                 (`layer_activation_bytes`) for s/cp tokens, of which the LayerNorm and
                 first-linear inputs and two dropout masks (10·sbh in 16-bit) are replicated
                 on the tp ranks and the rest split (Sec. 4.2.1, Eq. 2: sbh(10 + 24/t +
                 5as/(ht))). Checkpointed, a layer keeps its input e·sbh (Sec. 5: "2sbhL"),
                 plus one layer's full set while it is recomputed. The last stage adds the
                 head's bytes (`head_activation_bytes`, the logits split over tp).

Step time (`layout_step_time`; chapter 12's model on every axis). Per micro-batch the
slowest stage (the last: its layers plus the output projection) runs
    compute  FLOPs / (peak x efficiency) (the profile's roofline, compute-bound), FLOPs of
             `layer_flops_per_token` per layer and 6·V·d for the logits, split over tp·cp;
             checkpointed layers run their forward twice (4/3 of the layer FLOPs)
    tp_comm  per layer 2 all-reduces forward, 2 backward (Shoeybi et al. 2019, Sec. 3: f and
             g), 2 more when the forward is recomputed, each of b·(s/cp)·d activations, a ring
             on the intra-host link
    cp_comm  per layer the K and V blocks (2·b·(s/cp)·d/tp) go cp - 1 steps around the ring
             forward, twice that backward (K, V and dK, dV), once more when recomputed
             (ring attention, Liu et al. 2023), on the intra link if tp·cp fits a host
and the step adds, for the whole batch,
    bubble   (p - 1)/v stage-times: interleaved_bubble_fraction(p, m, v) of the step
             (Narayanan et al. 2021, Sec. 2.2; v = 1 is 1F1B's (p - 1)/(m + p - 1))
    pp_comm  2·(v·m + p - 1) messages of b·(s/cp)·d activations between stages, one forward
             and one backward in each of the schedule's v·m + p - 1 slots; across hosts each tp
             rank sends 1/tp on its own NIC, then an all-gather over the intra link (the
             paper's scatter/gather, Sec. 4.1)
    dp_comm  the worker's gradients all-reduced over dp·cp ranks in one flat buffer
             (`hierarchical_allreduce_time` when they span hosts, or one flat ring at the inter
             link's speed with allreduce="ring"); ZeRO runs per unit (a block, the embedding,
             the head: `zero_units`) a reduce-scatter and an all-gather, each half a ring
             all-reduce of the unit, as often as `zero_collectives` counts: stage 1 once a step,
             stage 2 a reduce-scatter every micro-batch, stage 3 also two all-gathers every
             micro-batch. Same bytes as `zero_comm_bytes` for stages 1 and 3 at m = 1; many more
             latencies (each unit's ring has its own 2(N-1) steps)
A profile with `shared_nic` gives each rank 1/ranks_per_host of the inter link (all the
host's ranks send at once). Overlap assumptions: none. Every part is on the critical path,
as in Megatron-LM 2021 (blocking tensor-parallel all-reduces and stage sends, the gradient
all-reduce after the last backward); overlap would only shorten the comm parts. Left out:
the optimizer step, LayerNorm, softmax and the other memory-bound kernels (folded into the
efficiency), imbalance other than the last stage's logits. The efficiency is one number,
whatever the GEMMs' sizes: the micro-batch size changes memory, messages and the bubble
here, not the rate of compute (Narayanan et al. 2021, Fig. 7, measure up to 1.3x from it
on one GPU). Sources: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models"; Liu et al. 2023, "Ring Attention with Blockwise Transformers".
Taught in `notebooks/16_capstone.ipynb`; it combines `notebooks/11_memory_sharding.ipynb` (memory)
and `notebooks/12_scalability.ipynb` (cost).
"""
from __future__ import annotations

from dataclasses import dataclass

from ddnb._checks import Checks, is_int
from ddnb.cost.alpha_beta import allreduce_time
from ddnb.cost.memory_model import (ACTIVATION_BYTES, PRECISIONS, OPTIMIZERS, head_activation_bytes,
                                    layer_activation_bytes, state_bytes_per_param)
from ddnb.cost.pipeline import interleaved_bubble_fraction, pipeline_activation_bytes
from ddnb.cost.scaling import hierarchical_allreduce_time
from ddnb.cost.transformer import block_params, transformer_params
from ddnb.cost.zero import STAGES, zero_comm_bytes, zero_memory_parts
from ddnb.emulate.profile import Link, get_profile
from ddnb.flops import layer_flops_per_token

SHAPE_KEYS = ("n_layers", "d_model", "n_heads", "vocab_size", "seq_len")
PARTS = ("compute", "bubble", "tp_comm", "cp_comm", "pp_comm", "dp_comm")


@dataclass(frozen=True)
class Layout:
    """dp × pp × tp × cp workers, ZeRO `zero` over dp·cp, checkpointing, micro-batches of
    `microbatch_size` sequences, `chunks` model chunks per pipeline rank (v > 1: interleaved)."""
    dp: int = 1
    pp: int = 1
    tp: int = 1
    cp: int = 1
    zero: int = 0
    checkpointing: bool = False
    microbatch_size: int = 1
    chunks: int = 1

    @property
    def workers(self) -> int:
        return self.dp * self.pp * self.tp * self.cp

    def microbatches(self, global_batch: int) -> int:
        """m = B / (dp · b): micro-batches each pipeline runs per step."""
        return global_batch // (self.dp * self.microbatch_size)

    def __str__(self) -> str:
        axes = " x ".join(f"{a} {getattr(self, a)}" for a in ("dp", "pp", "tp", "cp"))
        return (f"{axes}, zero {self.zero}, {'checkpointed' if self.checkpointing else 'no checkpointing'}, "
                f"b {self.microbatch_size}" + (f", v {self.chunks}" if self.chunks > 1 else ""))


def model_shape(model) -> dict:
    """{n_layers, d_model, n_heads, vocab_size, seq_len, mlp_ratio} of a `ddnb.models.GPTConfig`
    (or anything with those attributes) or a dict of them ("vocab" for vocab_size too)."""
    if isinstance(model, dict):
        d = dict(model)
        if "vocab" in d and "vocab_size" not in d:
            d["vocab_size"] = d.pop("vocab")
    else:
        d = {k: getattr(model, k, None) for k in SHAPE_KEYS + ("mlp_ratio",)}
    d.setdefault("mlp_ratio", 4)
    if d["mlp_ratio"] is None:
        d["mlp_ratio"] = 4
    with Checks("model") as check:
        missing = [k for k in SHAPE_KEYS if d.get(k) is None]
        check.rule(not missing, f"model={model!r}: missing {', '.join(missing)} (a GPTConfig, or a dict of "
                                f"{', '.join(SHAPE_KEYS)})")
        if not missing and check.positive_ints(**{k: d[k] for k in SHAPE_KEYS + ("mlp_ratio",)}):
            check.rule(d["d_model"] % d["n_heads"] == 0, f"d_model({d['d_model']}) must be divisible by "
                       f"n_heads({d['n_heads']})")
    return {k: d[k] for k in SHAPE_KEYS + ("mlp_ratio",)}


def layout_problems(shape: dict, layout: Layout, global_batch: int, ranks_per_host: int | None) -> list[str]:
    """Why `layout` cannot run `shape` (an empty list when it can): one reason per broken rule
    (the host rule only with a ranks_per_host)."""
    s, lay, out = shape, layout, []
    host = ranks_per_host is not None
    if host and lay.tp > ranks_per_host:
        out.append(f"tp {lay.tp} > {ranks_per_host} ranks per host")
    elif host and ranks_per_host % lay.tp:
        out.append(f"tp {lay.tp} does not divide {ranks_per_host} ranks per host (a tp group would span hosts)")
    if s["n_heads"] % lay.tp:
        out.append(f"heads {s['n_heads']} % tp {lay.tp} != 0")
    if s["n_layers"] % (lay.pp * lay.chunks):
        out.append(f"layers {s['n_layers']} % (pp {lay.pp} x chunks {lay.chunks}) != 0" if lay.chunks > 1
                   else f"layers {s['n_layers']} % pp {lay.pp} != 0")
    if s["seq_len"] % lay.cp:
        out.append(f"seq {s['seq_len']} % cp {lay.cp} != 0")
    if global_batch % (lay.dp * lay.microbatch_size):
        out.append(f"batch {global_batch} % (dp {lay.dp} x microbatch size {lay.microbatch_size}) != 0")
    elif lay.chunks > 1 and lay.microbatches(global_batch) % lay.pp:
        out.append(f"interleaved: {lay.microbatches(global_batch)} micro-batches % pp {lay.pp} != 0")
    if lay.zero >= 2 and lay.pp > 1:
        out.append(f"zero {lay.zero} with pp {lay.pp}: ZeRO-2/3 shard the gradients that the pipeline's "
                   f"micro-batches accumulate (DeepSpeed runs only stages 0-1 with pipeline parallelism)")
    return out


def _check(where: str, shape, layout, global_batch, precision, optimizer, ranks_per_host=None) -> dict:
    """The validated shape; every bad argument named at once, then the layout's own problems."""
    shape = model_shape(shape)
    with Checks(where) as check:
        if check.rule(isinstance(layout, Layout), f"layout={layout!r}: need a ddnb.cost.layout.Layout"):
            check.positive_ints(**{a: getattr(layout, a) for a in ("dp", "pp", "tp", "cp", "microbatch_size",
                                                                     "chunks")})
            check.rule(is_int(layout.zero) and layout.zero in STAGES, f"zero={layout.zero!r}: need one of {STAGES}")
            check.rule(isinstance(layout.checkpointing, bool), f"checkpointing={layout.checkpointing!r}: "
                                                                "need True or False")
        check.integer("global_batch", global_batch, min=1)
        check.choice("precision", precision, PRECISIONS)
        check.choice("optimizer", optimizer, OPTIMIZERS)
    problems = layout_problems(shape, layout, global_batch, ranks_per_host)
    if problems:
        raise ValueError(f"{where}: {layout} cannot run this model: " + "; ".join(problems))
    return shape


# ---------------------------------------------------------------- memory
def stage_params(shape: dict, pp: int, stage: str = "first", tied_embeddings: bool = True) -> int:
    """Parameters of the first or last of pp stages: (L/pp) blocks plus the token and
    position embeddings (first) or the final LayerNorm and output projection (last; a copy
    of the token embedding when tied). One stage (pp = 1): `transformer_params`."""
    L, d, V, T, r = (shape[k] for k in ("n_layers", "d_model", "vocab_size", "seq_len", "mlp_ratio"))
    if pp == 1:
        return transformer_params(L, d, V, T, r, tied_embeddings)
    blocks = L // pp * block_params(d, r)
    return blocks + ((V + T) * d if stage == "first" else 2 * d + V * d)


def layer_bytes(shape: dict, layout: Layout, precision: str = "mixed", dropout: bool = True) -> float:
    """Bytes one layer keeps for backward per micro-batch on one worker, without
    checkpointing: Korthikanti et al. 2022's layer for b sequences of s/cp tokens, the
    replicated 4·e·sbh + 2·sbh (masks) whole and the rest / tp (Sec. 4.2.1, Eq. 2)."""
    s, b, d = shape["seq_len"] // layout.cp, layout.microbatch_size, shape["d_model"]
    e = ACTIVATION_BYTES[precision]
    full = layer_activation_bytes(s, b, d, shape["n_heads"], e, dropout)
    replicated = 4 * e * s * b * d + (2 * s * b * d if dropout else 0)
    return replicated + (full - replicated) / layout.tp


def layout_memory(shape, layout: Layout, global_batch: int, precision: str = "mixed", optimizer: str = "adam",
                  dropout: bool = True, tied_embeddings: bool = True) -> dict:
    """Bytes on the fullest worker of `layout`: {"parameters", "gradients", "optimizer",
    "gathered", "activations", "total", "stage"} (the module docstring's formulas; "stage" is
    "first" or "last", whichever holds more)."""
    shape = _check("layout_memory", shape, layout, global_batch, precision, optimizer)
    lay, m = layout, layout.microbatches(global_batch)
    p_b, g_b, o_b = state_bytes_per_param(precision, optimizer)
    e, s, b, d = ACTIVATION_BYTES[precision], shape["seq_len"] // lay.cp, lay.microbatch_size, shape["d_model"]
    per_layer = layer_bytes(shape, lay, precision, dropout)
    kept = e * s * b * d if lay.checkpointing else per_layer       # per layer per micro-batch
    recompute = per_layer if lay.checkpointing else 0.0             # one layer rebuilt in backward
    chunk_bytes = max(1, round(shape["n_layers"] // (lay.pp * lay.chunks) * kept))
    schedule = "interleaved" if lay.chunks > 1 else "1f1b"
    best = None
    for stage, rank in (("first", 0), ("last", lay.pp - 1)):
        psi = stage_params(shape, lay.pp, stage, tied_embeddings) / lay.tp
        parts = zero_memory_parts(psi, lay.dp * lay.cp, lay.zero, k=o_b, param_bytes=p_b, grad_bytes=g_b)
        parts["gathered"] = 2 * block_params(d, shape["mlp_ratio"]) / lay.tp * p_b if lay.zero == 3 else 0.0
        act = pipeline_activation_bytes(schedule, lay.pp, m, chunk_bytes, rank=rank, chunks=lay.chunks) + recompute
        if rank == lay.pp - 1:                                       # the head's activations
            act += head_activation_bytes(s, b, d, -(-shape["vocab_size"] // lay.tp), e, dropout)
        parts["activations"] = float(act)
        parts["total"] = sum(parts.values())
        parts["stage"] = stage
        if best is None or parts["total"] > best["total"]:
            best = parts
        if lay.pp == 1:
            break
    return best


# ---------------------------------------------------------------- time
def layout_flops(shape, global_batch: int, checkpointing: bool) -> float:
    """FLOPs of one step on all workers: B·s·(L·layer FLOPs x (4/3 if checkpointed) + 6·V·d).
    With checkpointing this is Narayanan et al. 2021's Eq. (3), 96·B·s·l·h²·(1 + s/6h + V/16lh)."""
    shape = model_shape(shape)
    per_layer = layer_flops_per_token(shape["d_model"], shape["seq_len"], shape["mlp_ratio"])
    layers = shape["n_layers"] * per_layer * (4 / 3 if checkpointing else 1)
    per_token = layers + 6 * shape["vocab_size"] * shape["d_model"]
    return float(global_batch) * shape["seq_len"] * per_token


def _inter(profile):
    """The inter-host link one rank gets: the profile's, or 1/ranks_per_host of it when the
    ranks of a host share one NIC (`shared_nic`) and all send at once."""
    if not profile.shared_nic:
        return profile.inter
    return Link(profile.inter.alpha, profile.inter.bandwidth / profile.ranks_per_host, profile.inter.name)


ALLREDUCE = ("hierarchical", "ring")


def _group_allreduce(nbytes: float, size: int, stride: int, profile, algorithm: str = "hierarchical") -> float:
    """A ring all-reduce over `size` ranks `stride` apart: on the intra link when they share a
    host; across hosts hierarchical (algorithm "hierarchical", NCCL's two levels) when whole
    hosts' worth span several, else one flat ring whose every step waits for its slowest hop,
    the inter link (algorithm "ring": what ddnb's ring and the emulated cluster run)."""
    if size == 1 or nbytes == 0:
        return 0.0
    per_host = max(1, min(size, profile.ranks_per_host // stride))
    if per_host == size:
        return allreduce_time("ring", nbytes, size, profile.intra.alpha, profile.intra.beta)
    if algorithm == "hierarchical" and per_host > 1 and size % per_host == 0:
        return hierarchical_allreduce_time(nbytes, size, per_host, profile.intra, _inter(profile))
    return allreduce_time("ring", nbytes, size, profile.inter.alpha, _inter(profile).beta)


def zero_units(shape: dict, pp: int) -> int:
    """Units ZeRO lays out flat on one stage, each reduce-scattered and all-gathered on its
    own: one per block, plus the embedding (first stage) and the head (last stage); the
    layer-by-layer wrapping of ddnb's ZeRO (`ddnb.sharding.flat.default_units`) and of FSDP."""
    return shape["n_layers"] // pp + (2 if pp == 1 else 1)


def zero_collectives(stage: int, units: int, microbatches: int) -> dict:
    """{"reduce_scatter": n, "all_gather": n} that ZeRO `stage` runs per step with `units`
    units and m `microbatches` (Rajbhandari et al. 2020, Sec. 5; the counts of ddnb.sharding):
    stage 1 one of each per unit at the step; stage 2 a reduce-scatter per unit in every
    micro-batch's backward (as DeepSpeed's stage 2 at each micro-step) and the all-gather at
    the step; stage 3 per micro-batch a reduce-scatter and two all-gathers (forward, backward)."""
    m, u = microbatches, units
    return {1: {"reduce_scatter": u, "all_gather": u}, 2: {"reduce_scatter": m * u, "all_gather": u},
            3: {"reduce_scatter": m * u, "all_gather": 2 * m * u}}[stage]


def layout_step_time(shape, layout: Layout, profile, global_batch: int, precision: str = "mixed",
                     optimizer: str = "adam", tied_embeddings: bool = True, allreduce: str = "hierarchical") -> dict:
    """Predicted seconds of one step of `layout` on `profile` (a ddnb.emulate Profile or its
    name): {"step_time", "compute", "bubble", "tp_comm", "cp_comm", "pp_comm", "dp_comm"}, each
    part as the module docstring states it (no overlap). `allreduce`: how the dp·cp group's
    collectives cross hosts, "hierarchical" (NCCL's) or "ring" (one flat ring, ddnb's)."""
    prof = get_profile(profile)
    with Checks("layout_step_time") as check:                  # the one validation helper, as plan's
        check.choice("allreduce", allreduce, ALLREDUCE)
    shape = _check("layout_step_time", shape, layout, global_batch, precision, optimizer, prof.ranks_per_host)
    lay, m = layout, layout.microbatches(global_batch)
    L, d, V, T = (shape[k] for k in ("n_layers", "d_model", "vocab_size", "seq_len"))
    e = ACTIVATION_BYTES[precision]
    p_b, g_b, _ = state_bytes_per_param(precision, optimizer)
    b, s, layers = lay.microbatch_size, T // lay.cp, L // lay.pp
    # per micro-batch, on the last (slowest) stage
    flops = b * T * (layers * layer_flops_per_token(d, T, shape["mlp_ratio"]) * (4 / 3 if lay.checkpointing else 1)
                     + 6 * V * d) / (lay.tp * lay.cp)
    compute = flops / (prof.peak_flops * prof.efficiency)
    act = b * s * d * e                                      # bytes of one micro-batch's (b, s/cp, d)
    tp = 0.0
    if lay.tp > 1:
        ar = allreduce_time("ring", act, lay.tp, prof.intra.alpha, prof.intra.beta)
        tp = layers * (6 if lay.checkpointing else 4) * ar
    cp = 0.0
    if lay.cp > 1:
        link = prof.intra if lay.tp * lay.cp <= prof.ranks_per_host else _inter(prof)
        passes = 3 + (1 if lay.checkpointing else 0)
        cp = layers * passes * (lay.cp - 1) * link.time(2 * act / lay.tp)
    stage = compute + tp + cp
    f = interleaved_bubble_fraction(lay.pp, m, lay.chunks)
    parts = {"compute": m * compute, "tp_comm": m * tp, "cp_comm": m * cp, "bubble": m * stage * f / (1 - f)}
    pp = 0.0
    if lay.pp > 1:
        stride = lay.tp * lay.cp * lay.dp                    # ranks between neighbouring stages
        if stride * lay.pp <= prof.ranks_per_host:
            message = prof.intra.time(act)
        elif lay.tp > 1:                                     # scatter over tp NICs, all-gather on the host
            message = _inter(prof).time(act / lay.tp) + (lay.tp - 1) * prof.intra.alpha + (
                lay.tp - 1) / lay.tp * act / prof.intra.bandwidth
        else:
            message = _inter(prof).time(act)
        pp = 2 * (lay.chunks * m + lay.pp - 1) * message     # one each way per slot of the schedule
    parts["pp_comm"] = pp
    psi = stage_params(shape, lay.pp, "first", tied_embeddings) / lay.tp
    group = lay.dp * lay.cp
    if lay.zero == 0:
        dp = _group_allreduce(psi * g_b, group, lay.tp, prof, allreduce)     # one flat buffer
    else:                        # per unit: a reduce-scatter or an all-gather is half an all-reduce
        units = zero_units(shape, lay.pp)
        count = zero_collectives(lay.zero, units, m)
        dp = (count["reduce_scatter"] * _group_allreduce(psi * g_b / units, group, lay.tp, prof, allreduce)
              + count["all_gather"] * _group_allreduce(psi * p_b / units, group, lay.tp, prof, allreduce)) / 2
    parts["dp_comm"] = dp
    parts = {k: parts[k] for k in PARTS}
    return {"step_time": sum(parts.values()), **parts}


def textbook_dp_comm(shape, layout: Layout, profile, global_batch: int, precision: str = "mixed",
                     optimizer: str = "adam", tied_embeddings: bool = True) -> float:
    """dp_comm as the textbook counts ZeRO's traffic, and as this planner's first version did:
    one all-reduce's time of the stage's gradients per step for stages 0-2 (Rajbhandari et al.
    2020, Sec. 7.2.1: a reduce-scatter and an all-gather are one all-reduce's volume), 1.5x
    that at every micro-batch for stage 3 (`zero_comm_bytes`), hierarchical across hosts.
    It leaves out the latencies of one collective per unit; chapter 16 shows the emulated
    cluster refuting it (`ddnb.bench.plan_check`)."""
    prof = get_profile(profile)
    shape = _check("textbook_dp_comm", shape, layout, global_batch, precision, optimizer, prof.ranks_per_host)
    p_b, g_b, _ = state_bytes_per_param(precision, optimizer)
    psi, group = stage_params(shape, layout.pp, "first", tied_embeddings) / layout.tp, layout.dp * layout.cp
    dp = _group_allreduce(psi * g_b, group, layout.tp, prof)
    if layout.zero == 3 and group > 1:
        dp *= layout.microbatches(global_batch) * zero_comm_bytes(psi, group, 3, p_b, g_b) / zero_comm_bytes(
            psi, group, 0, p_b, g_b)
    return dp


def achieved_flops(shape, layout: Layout, profile, global_batch: int, **kwargs) -> float:
    """FLOP/s per worker: `layout_flops` / (predicted step time x workers)."""
    step = layout_step_time(shape, layout, profile, global_batch, **kwargs)["step_time"]
    return layout_flops(shape, global_batch, layout.checkpointing) / (step * layout.workers)
