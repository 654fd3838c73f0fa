"""The router of a mixture-of-experts layer: which experts each token goes to, with what
weight, which tokens overflow an expert's capacity, and the load-balancing loss.

Top-k gating (Shazeer et al. 2017, "Outrageously Large Neural Networks: The
Sparsely-Gated Mixture-of-Experts Layer", arXiv 1701.06538, Sec. 2.1): a linear router
gives each token x logits h(x) = x W_r (E experts); p(x) = softmax(h(x)) and the token
goes to the k experts of largest p_i(x), its output being Σ_{i in top-k} g_i(x) E_i(x)
with g_i = p_i (Switch, Fedus et al. 2021, arXiv 2101.03961, Eq. 1-2, k = 1), or
renormalized over the k chosen (normalize=True, as GShard's top-2 and Mixtral do).

Capacity (Switch Sec. 2.2, Eq. 3; GShard, Lepikhin et al. 2020, arXiv 2006.16668,
Alg. 1): each expert takes at most

    capacity = ceil(capacity_factor · k · T / E)        tokens of a batch of T tokens

Assignments are served in priority order, every token's first choice (in token order)
before any second choice (GShard's top-2 order); an assignment beyond its expert's
capacity is **dropped**: it contributes nothing (in a Transformer the residual connection
carries the token on unchanged). capacity_factor=None: no capacity, nothing dropped.

Load-balancing loss (Switch Eq. 4-6), in [1, E], 1 when perfectly balanced:

    aux = E · Σ_i f_i · P_i,   f_i = (assignments to expert i) / (k·T)    (Eq. 5, before dropping)
                               P_i = (1/T) Σ_x p_i(x)                      (Eq. 6)

f is a count (no gradient); P carries the gradient to the router. The training loss adds
α·aux (Switch: α = 1e-2). Taught in `notebooks/13_sequence_context_expert.ipynb`.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ddnb._checks import Checks


class Routing(NamedTuple):
    """One batch's routing. Kept assignments (A,) each, in priority order: token, expert,
    gate. counts (E,): assignments per expert before dropping; dropped: how many were
    dropped; aux: the load-balancing loss (scalar, differentiable)."""

    token: torch.Tensor
    expert: torch.Tensor
    gate: torch.Tensor
    counts: torch.Tensor
    dropped: int
    aux: torch.Tensor


def capacity_of(tokens: int, num_experts: int, top_k: int, capacity_factor: float | None) -> int | None:
    """ceil(capacity_factor · top_k · tokens / num_experts) (Switch Eq. 3 with k choices per
    token); None when capacity_factor is None (no limit)."""
    if capacity_factor is None:
        return None
    return math.ceil(capacity_factor * top_k * tokens / num_experts)


def check_routing(check: Checks, num_experts, top_k, capacity_factor) -> None:
    """The router's rules, added to `check` (one error for the whole call)."""
    if check.integer("num_experts", num_experts, min=1) and check.integer("top_k", top_k, min=1):
        check.rule(top_k <= num_experts, f"top_k={top_k} is greater than num_experts={num_experts}: a token "
                                         f"cannot choose more experts than there are")
    check.number("capacity_factor", capacity_factor, positive=True, none=True)


def route(logits: torch.Tensor, top_k: int = 1, capacity_factor: float | None = None,
          normalize: bool = False) -> Routing:
    """Route T tokens from their router logits (T, E): top-k, capacity, dropping, aux loss
    (the module's docstring)."""
    T, E = logits.shape
    with Checks("route") as check:
        check_routing(check, E, top_k, capacity_factor)
    probs = logits.softmax(dim=-1)                                      # (T, E)
    gate, expert = probs.topk(top_k, dim=-1)                            # (T, k) each
    if normalize:
        gate = gate / gate.sum(dim=-1, keepdim=True)
    expert_all = expert.t().reshape(-1)                                 # (k·T,): first choices, then second...
    token_all = torch.arange(T, device=logits.device).repeat(top_k)    # (k·T,)
    gate_all = gate.t().reshape(-1)                                     # (k·T,)
    onehot = F.one_hot(expert_all, E)                                   # (k·T, E)
    position = (onehot.cumsum(0) - 1).gather(1, expert_all[:, None]).squeeze(1)   # (k·T,): place in its queue
    capacity = capacity_of(T, E, top_k, capacity_factor)
    keep = torch.ones_like(expert_all, dtype=torch.bool) if capacity is None else position < capacity
    counts = onehot.sum(0)                                              # (E,)
    f = counts.to(probs.dtype) / max(top_k * T, 1)                      # Eq. 5
    aux = E * (f * probs.mean(0)).sum()                                 # Eq. 4 with Eq. 6
    return Routing(token_all[keep], expert_all[keep], gate_all[keep], counts, int((~keep).sum()), aux)
