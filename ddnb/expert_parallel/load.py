"""Where the tokens go: one expert-parallel forward on every rank, measured (tokens each
expert receives, assignments dropped at the capacity, bytes sent), for the MoE load
widget and notebook 13. A `skew` adds skew x (0 .. 1) to the router's logits across the
expert ids (0: an untrained router, balanced on average; 2: the last experts favoured, the
imbalance that the load-balancing loss exists to prevent).
Taught in `notebooks/13_sequence_context_expert.ipynb`.
"""
from __future__ import annotations

from ddnb._checks import Checks


def check_load_args(num_experts, top_k, capacity_factor, world_size: int, tokens) -> None:
    """One ValueError naming every bad argument of `moe_load` (before any process runs)."""
    with Checks("moe_load") as check:
        check.integer("num_experts", num_experts, min=1)
        check.integer("top_k", top_k, min=1, max=num_experts if isinstance(num_experts, int) else None,
                      why=" (experts per token)")
        check.number("capacity_factor", capacity_factor, positive=True, none=True)
        check.integer("tokens", tokens, min=1, why=" (per rank)")
        if isinstance(num_experts, int) and num_experts >= 1:
            check.rule(num_experts % world_size == 0,
                       f"num_experts={num_experts} is not divisible by the {world_size} ranks (each rank holds E/N)")


def moe_load(num_experts: int = 8, top_k: int = 1, capacity_factor: float | None = 1.0, skew: float = 0.0,
             tokens: int = 64, d_model: int = 8, seed: int = 0) -> dict:
    """On every rank of the default group: route `tokens` tokens of its own through an
    `ExpertParallelMoE` (E/N experts per rank) and return {"rank", "received" (tokens per
    local expert), "dropped", "assigned" (top_k · tokens), "capacity", "sent_bytes"}. The
    layer and tokens live on `rank_device()` (the rank's GPU when its group has nccl)."""
    import torch
    import torch.distributed as dist

    from ddnb.collectives.devices import rank_device
    from ddnb.expert_parallel import ExpertParallelMoE, MoE, capacity_of
    from ddnb.trace import Tracer

    rank, n = dist.get_rank(), dist.get_world_size()
    check_load_args(num_experts, top_k, capacity_factor, n, tokens)
    ref = MoE(d_model, 2 * d_model, num_experts=num_experts, top_k=top_k, capacity_factor=capacity_factor, seed=seed)
    with torch.no_grad():   # the router has no bias: feature 0 carries the skew, weighted 0..1 across experts
        ref.router.weight[:, 0] += torch.linspace(0, 1, num_experts)
    tracer = Tracer()
    model = ExpertParallelMoE.from_module(ref.to(rank_device()), None, tracer)
    x = torch.randn(tokens, d_model, generator=torch.Generator().manual_seed(seed + 1 + rank))   # (T, d)
    x[:, 0] += skew                                     # logits gain skew * (0 .. 1) across the experts
    x = x.to(rank_device())
    with torch.no_grad():
        model(x)
    sent = sum(e["nbytes"] for e in tracer.take() if e["kind"] == "send")
    return {"rank": rank, "received": model.last["received"], "dropped": model.last["dropped"],
            "assigned": top_k * tokens, "capacity": capacity_of(tokens, num_experts, top_k, capacity_factor),
            "sent_bytes": sent}
