"""A mixture-of-experts layer, first on one process (`MoE`), then with its experts spread
over the ranks of a group (`ExpertParallelMoE`): expert parallelism.

    MoE                 router + E expert MLPs, every expert here: the reference
    ExpertParallelMoE   the same router on every rank, E/N experts per rank; each rank
                        routes its own tokens, sends each token to the rank of its expert
                        (dispatch), that rank runs it, and sends the result back (combine)

Expert parallelism (GShard, Lepikhin et al. 2020, arXiv 2006.16668, Sec. 2.2 and 3.2;
Switch, Fedus et al. 2021, Sec. 2.2 and Fig. 3): rank r holds experts
[r·E/N, (r+1)·E/N). A forward step is

    1. route (router.py): the kept (token, expert, gate) assignments, sorted by expert, so
       the rows for rank j are one contiguous chunk, in its experts' order;
    2. exchange the counts: an equal all-to-all of an (N, E/N) int64 table, rank i's row j
       = how many of its tokens go to each of rank j's experts;
    3. dispatch: the **uneven** all-to-all (`ddnb.collectives.all_to_all` with split sizes)
       of the token rows, input_split_sizes[j] = rows for rank j, output_split_sizes[i] =
       rows from rank i (step 2's table);
    4. each local expert runs on its rows (from every rank at once);
    5. combine: the all-to-all with the split sizes swapped brings the rows back;
       y[token] += gate · row.

Backward is the same two all-to-alls reversed (`ddnb.collectives.autograd`). Bytes one
rank sends per forward (d-dimensional rows of s bytes per element):

    counts  (N-1)·(E/N)·8        dispatch  Σ_{j≠r} in_j · d·s        combine  Σ_{j≠r} out_j · d·s

and backward sends the dispatch's and the combine's bytes once more. Routing, capacity
and the load-balancing loss use each rank's own tokens (a rank's batch is a "group" in
GShard's words), so `ExpertParallelMoE` on N ranks equals `MoE(x, groups=N)` on the
concatenated batch, forward and backward, dropped tokens included; with no capacity
limit, routing does not depend on the grouping and it equals `MoE(x)`. The router's
weights are replicated: their gradients are summed over the group, as data parallelism
does (`sync_router_grads`). Taught in `notebooks/13_sequence_context_expert.ipynb`.

    moe = MoE(d_model=8, d_hidden=16, num_experts=4, top_k=2, capacity_factor=1.25, seed=0)
    ep = ExpertParallelMoE.from_module(moe, group)       # on every rank of the group
    y, aux = ep(x_local)                                  # (T/N, d), scalar
"""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn

from ddnb._checks import Checks
from ddnb.collectives.all_to_all import all_to_all
from ddnb.collectives.autograd import all_to_all_autograd
from ddnb.collectives.p2p import group_rank, group_size
from ddnb.context_parallel.agree import agree, dtype_code
from ddnb.expert_parallel.router import check_routing, route
from ddnb.trace import Tracer


def expert_mlp(d_model: int, d_hidden: int) -> nn.Sequential:
    """One expert: Linear(d, h) -> GELU -> Linear(h, d), as the Transformer's MLP."""
    return nn.Sequential(nn.Linear(d_model, d_hidden), nn.GELU(), nn.Linear(d_hidden, d_model))


def run_experts(experts, first: int, rows: torch.Tensor, expert_of_row: torch.Tensor) -> torch.Tensor:
    """Each row (R, d) through its expert (expert_of_row (R,), global ids; experts[i] is
    expert first+i): a new (R, d), differentiable."""
    out = torch.zeros_like(rows)                                        # (R, d)
    for i, expert in enumerate(experts):
        idx = (expert_of_row == first + i).nonzero().squeeze(1)         # (R_i,)
        if idx.numel():
            out = out.index_add(0, idx, expert(rows.index_select(0, idx)))
    return out


class MoE(nn.Module):
    """x (T, d) -> (y (T, d), aux): y_t = Σ_{kept (t, i)} gate · expert_i(x_t). groups=G
    routes each of G equal slices of the batch on its own (capacity and aux per slice;
    aux is their mean). `last` holds the last call's counts and drops per group."""

    def __init__(self, d_model: int, d_hidden: int, num_experts: int, top_k: int = 1,
                 capacity_factor: float | None = None, normalize: bool = False, seed: int = 0):
        super().__init__()
        with Checks("MoE") as check:
            check.positive_ints(d_model=d_model, d_hidden=d_hidden)
            check_routing(check, num_experts, top_k, capacity_factor)
        self.num_experts, self.top_k, self.capacity_factor, self.normalize = (num_experts, top_k,
                                                                              capacity_factor, normalize)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.router = nn.Linear(d_model, num_experts, bias=False)
            self.experts = nn.ModuleList(expert_mlp(d_model, d_hidden) for _ in range(num_experts))
        self.last: dict = {}

    def forward(self, x: torch.Tensor, groups: int = 1):               # (T, d)
        with Checks("MoE.forward") as check:
            if check.integer("groups", groups, min=1):
                check.rule(x.shape[0] % groups == 0, f"{x.shape[0]} tokens do not split into groups={groups}")
        ys, auxes, self.last = [], [], {"counts": [], "dropped": []}
        for xg in x.chunk(groups):                                      # (T/G, d)
            r = route(self.router(xg), self.top_k, self.capacity_factor, self.normalize)
            out = run_experts(self.experts, 0, xg.index_select(0, r.token), r.expert)    # (A, d)
            ys.append(torch.zeros_like(xg).index_add(0, r.token, r.gate.unsqueeze(1) * out))
            auxes.append(r.aux)
            self.last["counts"].append(r.counts.tolist())
            self.last["dropped"].append(r.dropped)
        return torch.cat(ys), torch.stack(auxes).mean()


class ExpertParallelMoE(nn.Module):
    """`MoE` with rank r of `group` holding experts [r·E/N, (r+1)·E/N) and a copy of the
    router: x (T, d), this rank's tokens -> (y (T, d), aux of these tokens). `last`: the
    counts per expert, drops, and rows received per local expert, of the last call."""

    def __init__(self, router: nn.Linear, experts, num_experts: int, top_k: int, capacity_factor, normalize,
                 group=None, tracer: Tracer | None = None):
        super().__init__()
        self.router, self.experts = router, nn.ModuleList(experts)
        self.num_experts, self.top_k, self.capacity_factor, self.normalize = (num_experts, top_k,
                                                                              capacity_factor, normalize)
        self.group, self.tracer = group, tracer
        self.rank, self.n = group_rank(group), group_size(group)
        self.first = self.rank * len(self.experts)                      # global id of experts[0]
        self.last: dict = {}

    @classmethod
    def from_module(cls, moe: MoE, group=None, tracer: Tracer | None = None) -> "ExpertParallelMoE":
        """This rank's experts and a copy of the router of `moe` (the same on every rank)."""
        n, E = group_size(group), moe.num_experts
        with Checks("ExpertParallelMoE") as check:
            check.rule(E % n == 0, f"num_experts={E} is not divisible by the group's {n} ranks "
                                   f"(each rank holds E/N experts)")
        per = E // n
        mine = moe.experts[group_rank(group) * per:(group_rank(group) + 1) * per]
        return cls(copy.deepcopy(moe.router), copy.deepcopy(list(mine)), E, moe.top_k, moe.capacity_factor,
                   moe.normalize, group, tracer)

    def _check(self, x) -> None:
        d = self.router.in_features
        found = [] if isinstance(x, torch.Tensor) and x.dim() == 2 and x.shape[1] == d else [
            f"x must be (tokens, d_model={d}), got {tuple(x.shape) if isinstance(x, torch.Tensor) else type(x)}"]
        fields = {"d_model": d, "num_experts": self.num_experts, "top_k": self.top_k,
                  "dtype": 0 if found else dtype_code(x.dtype)}
        agree("ExpertParallelMoE", found, fields, self.group, self.tracer)

    def forward(self, x: torch.Tensor):                                 # (T, d)
        self._check(x)
        n, per = self.n, len(self.experts)
        r = route(self.router(x), self.top_k, self.capacity_factor, self.normalize)
        order = torch.argsort(r.expert, stable=True)                    # by expert, so by destination rank
        token, expert, gate = r.token[order], r.expert[order], r.gate[order]     # (A,) each
        sent = torch.bincount(expert, minlength=self.num_experts).view(n, per)   # (N, E/N): to rank j's experts
        got = torch.empty_like(sent)                                     # (N, E/N): from rank i, to my experts
        all_to_all(got, sent, group=self.group, tracer=self.tracer, check=False)
        in_splits, out_splits = sent.sum(1).tolist(), got.sum(1).tolist()
        rows = all_to_all_autograd(x.index_select(0, token), out_splits, in_splits, self.group, self.tracer)
        local = self.first + torch.arange(per, device=got.device).repeat(n).repeat_interleave(got.reshape(-1))   # (R,)
        out = run_experts(self.experts, self.first, rows, local)        # (R, d)
        back = all_to_all_autograd(out, in_splits, out_splits, self.group, self.tracer)       # (A, d)
        y = torch.zeros_like(x).index_add(0, token, gate.unsqueeze(1) * back)
        self.last = {"counts": r.counts.tolist(), "dropped": r.dropped, "received": got.sum(0).tolist(),
                     "in_splits": in_splits, "out_splits": out_splits}
        return y, r.aux


@torch.no_grad()
def sync_router_grads(model: ExpertParallelMoE) -> None:
    """Sum the router's gradient over the group (every rank holds a copy of the router and
    saw different tokens): then each copy has the gradient of the summed loss."""
    for p in model.router.parameters():
        if p.grad is not None and model.n > 1:
            dist.all_reduce(p.grad, group=model.group)


def moe_bytes_per_rank(in_splits: list[int], out_splits: list[int], rank: int, d_model: int,
                       element_size: int = 4, backward: bool = True) -> int:
    """Bytes rank sends in one step: the counts table (N-1)·(E/N)·8 is not included (see
    the module's docstring); dispatch Σ_{j≠rank} in_splits[j] rows and combine
    Σ_{j≠rank} out_splits[j] rows of d_model elements, twice with backward."""
    rows = sum(s for j, s in enumerate(in_splits) if j != rank) + sum(s for j, s in enumerate(out_splits)
                                                                       if j != rank)
    return rows * d_model * element_size * (2 if backward else 1)
