"""ddnb.expert_parallel: the router (top-k, capacity, dropped tokens, Switch's aux loss) by
hand; ExpertParallelMoE on 2, 3 and 4 ranks equal to the single-process MoE forward and
backward (float64, within 1e-5): with no capacity limit equal to MoE(x) on the whole
batch, with dropping equal to MoE(x, groups=N); tokens per expert per rank and bytes sent
(from the trace) against the routing; bad input named before any data message."""
import math

import pytest
import torch
import torch.distributed as dist

from ddnb.collectives.autograd import all_to_all_autograd
from ddnb.expert_parallel import ExpertParallelMoE, MoE, capacity_of, moe_bytes_per_rank, route, sync_router_grads
from ddnb.trace import Tracer
from subgroups import WORLD, group_of_size, groups, run_all

D, HIDDEN, TOKENS = 6, 8, 7          # tokens per rank


CASES = [(1, None, 1), (2, None, 2), (2, 1.0, 2), (1, 0.5, 1)]   # (top_k, capacity_factor, experts per rank)


def make(n, top_k, cf, per, seed=0):
    moe = MoE(D, HIDDEN, per * n, top_k=top_k, capacity_factor=cf, normalize=top_k > 1, seed=seed).double()
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(n * TOKENS, D, generator=g, dtype=torch.float64)
    w = torch.randn(n * TOKENS, D, generator=g, dtype=torch.float64)
    return moe, x, w


def ep_run():
    out = []
    for group, n in groups():
        r = dist.get_rank(group)
        for top_k, cf, per in CASES:
            moe, x, w = make(n, top_k, cf, per)
            tracer = Tracer(rank=r)
            ep = ExpertParallelMoE.from_module(moe, group, tracer)
            xl = x.chunk(n)[r].clone().requires_grad_()
            y, aux = ep(xl)
            ((y * w.chunk(n)[r]).sum() + 0.1 * aux / n).backward()
            sync_router_grads(ep)
            grads = {name: p.grad for name, p in ep.named_parameters()}
            out.append((n, top_k, cf, r, y.detach(), aux.item(), xl.grad, grads, ep.last, tracer.take()))
    return out


@pytest.fixture(scope="module")
def runs(world):
    return run_all(world, ep_run)


def test_equal_to_the_single_process_moe_forward_and_backward(runs):
    by_case = {}
    for n, top_k, cf, r, *rest in runs:
        by_case.setdefault((n, top_k, cf), {})[r] = rest
    assert {k[0] for k in by_case} == {2, 3, 4} and len(by_case) == 3 * len(CASES)
    dropped_somewhere = False
    for (n, top_k, cf), ranks in by_case.items():
        per = next(p for k, c, p in CASES if (k, c) == (top_k, cf))
        moe, x, w = make(n, top_k, cf, per)
        x.requires_grad_()
        y, aux = moe(x, groups=n)
        ((y * w).sum() + 0.1 * aux).backward()
        dropped_somewhere |= sum(moe.last["dropped"]) > 0
        got_y = torch.cat([ranks[r][0] for r in range(n)])
        assert (got_y - y).abs().max() < 1e-5, (n, top_k, cf)
        assert abs(sum(ranks[r][1] for r in range(n)) / n - aux.item()) < 1e-5
        assert (torch.cat([ranks[r][2] for r in range(n)]) - x.grad).abs().max() < 1e-5
        ref = dict(moe.named_parameters())
        for r in range(n):
            for name, g in ranks[r][3].items():
                if name.startswith("experts."):                  # local expert i is global expert r·per + i
                    i, rest = name.split(".", 2)[1:]
                    name = f"experts.{r * per + int(i)}.{rest}"
                assert (g - ref[name].grad).abs().max() < 1e-5, (n, top_k, cf, r, name)
        if cf is None:                                           # no capacity: grouping changes nothing
            y_whole, _ = moe(x.detach(), groups=1)
            assert (got_y - y_whole).abs().max() < 1e-5
            assert sum(moe.last["dropped"]) == 0
    assert dropped_somewhere, "the capacity cases must drop tokens"


def test_tokens_per_expert_and_bytes_from_the_trace(runs):
    for n, top_k, cf, r, y, aux, xg, grads, last, events in runs:
        per = next(p for k, c, p in CASES if (k, c) == (top_k, cf))
        moe, x, _ = make(n, top_k, cf, per)
        moe(x, groups=n)
        cap = capacity_of(TOKENS, per * n, top_k, cf)
        kept = [[c if cap is None else min(c, cap) for c in counts] for counts in moe.last["counts"]]
        assert last["counts"] == moe.last["counts"][r] and last["dropped"] == moe.last["dropped"][r]
        assert last["received"] == [sum(k[e] for k in kept) for e in range(r * per, (r + 1) * per)]
        assert sum(last["in_splits"]) == sum(kept[r]) == TOKENS * top_k - last["dropped"]
        sent = sum(e["nbytes"] for e in events if e["kind"] == "send" and e["name"] == "all_to_all")
        counts_table = (n - 1) * per * 8
        assert sent == moe_bytes_per_rank(last["in_splits"], last["out_splits"], r, D, element_size=8) + \
            counts_table, (n, top_k, cf, r)


def test_router_by_hand():
    logits = torch.tensor([[2.0, 1, 0], [2, 0, 1], [2, 1, 0], [0, 2, 1], [1, 0, 2]]).log()   # probs ∝ row
    r = route(logits, top_k=1, capacity_factor=None)
    assert r.expert.tolist() == [0, 0, 0, 1, 2] and r.counts.tolist() == [3, 1, 1] and r.dropped == 0
    assert capacity_of(5, 3, 1, 1.0) == 2 and capacity_of(5, 3, 2, 1.25) == math.ceil(1.25 * 10 / 3) == 5
    r = route(logits, top_k=1, capacity_factor=1.0)              # capacity 2: token 2's choice overflows
    assert r.token.tolist() == [0, 1, 3, 4] and r.dropped == 1
    r2 = route(logits, top_k=2, capacity_factor=0.6)             # capacity ceil(0.6·10/3) = 2
    assert r2.token.tolist() == [0, 1, 3, 4, 0, 1] and r2.expert.tolist() == [0, 0, 1, 2, 1, 2]
    assert r2.dropped == 4          # first choices in token order (t2 overflows e0), then seconds (t2, t3, t4)
    probs = logits.softmax(-1)
    f = torch.tensor([3, 1, 1]) / 5
    assert torch.isclose(route(logits).aux, 3 * (f * probs.mean(0)).sum())
    balanced = route(torch.zeros(6, 3))                          # equal probs: aux = E·Σ f_i/E = 1
    assert torch.isclose(balanced.aux, torch.tensor(1.0))


@pytest.mark.parametrize("cf", [0.25, 0.5, 1.0, 1.5, 2.0, None])
def test_dropped_tokens_against_the_capacity_factor(cf):
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(64, 8, generator=g) + torch.linspace(0, 2, 8)   # skewed toward the last experts
    for k in (1, 2):
        r = route(logits, top_k=k, capacity_factor=cf)
        cap = capacity_of(64, 8, k, cf)
        assert r.dropped == (0 if cap is None else sum(max(0, c - cap) for c in r.counts.tolist()))
        assert len(r.token) == 64 * k - r.dropped


def test_bad_configurations_named():
    with pytest.raises(ValueError, match=r"MoE: top_k=5 is greater than num_experts=4.*capacity_factor=0"):
        MoE(4, 8, 4, top_k=5, capacity_factor=0)
    with pytest.raises(ValueError, match=r"d_model=0: need an integer >= 1"):
        MoE(0, 8, 4)
    with pytest.raises(ValueError, match=r"top_k=3 is greater than num_experts=2"):
        route(torch.zeros(4, 2), top_k=3)


def bad_calls():
    group = group_of_size(3)
    if group == "none":
        return None
    r, tracer = dist.get_rank(group), Tracer()
    out = {}
    try:
        ExpertParallelMoE.from_module(MoE(4, 8, 4), group)
    except ValueError as e:
        out["experts"] = str(e)
    ep = ExpertParallelMoE.from_module(MoE(4, 8, 6), group, tracer)
    try:
        ep(torch.zeros(5, 4 if r != 1 else 3))
    except ValueError as e:
        out["one rank"] = str(e)
    try:
        all_to_all_autograd(torch.zeros(6, 2), [2, 2, 2], [1, 1, 1], group, tracer)
    except ValueError as e:
        out["splits"] = str(e)
    events = tracer.take()
    y, _ = ep(torch.ones(5, 4))                                  # still in step
    return r, out, events, tuple(y.shape)


def test_bad_input_raises_on_every_rank_before_any_data(world):
    results = [res for res in world(WORLD).run(bad_calls) if res is not None]
    assert len(results) == 3
    for r, out, events, shape in results:
        assert "num_experts=4 is not divisible by the group's 3 ranks" in out["experts"]
        assert f"ExpertParallelMoE on rank {r}: bad arguments. Ranks [1]: x must be (tokens, d_model=4), " \
               f"got (5, 3)" in out["one rank"]
        assert "input_split_sizes=[1, 1, 1] sums to 3, but input has 6 rows" in out["splits"]
        assert all(e["name"] == "check" for e in events if e["kind"] in ("send", "recv"))
        assert shape == (5, 4)
