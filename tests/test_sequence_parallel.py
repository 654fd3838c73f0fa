"""ddnb.tensor_parallel.sequence: the sequence-parallel block equal to the unsharded
ddnb.models.Block (rows of its output, input gradient, LayerNorm gradients) and to the
tensor-parallel block (every sharded weight's gradient) within 1e-5 in float64, on 2, 3
and 4 ranks; its collectives counted from the trace; activation bytes per rank measured
with SavedActivations against Korthikanti et al.'s Table 2 terms for this block (float32,
no dropout), exactly, for TP and TP+SP."""
import pytest
import torch
import torch.distributed as dist

from ddnb.tensor_parallel.comms import count_collectives
from ddnb.tensor_parallel.sequence import activation_formula
from ddnb.trace import Tracer
from subgroups import groups, run_all

S, B, D, HEADS = 12, 2, 24, 12


def sp_run():
    from ddnb.memory import SavedActivations
    from ddnb.models import Block, GPTConfig
    from ddnb.tensor_parallel import TensorParallelBlock
    from ddnb.tensor_parallel.sequence import SequenceParallelBlock, sync_sequence_parallel_grads

    out = []
    for group, t in groups():
        r = dist.get_rank(group)
        torch.manual_seed(0)
        block = Block(GPTConfig(d_model=D, n_heads=HEADS, seq_len=S))
        x, w = torch.randn(B, S, D), torch.randn(B, S, D)
        res = {"t": t, "r": r}
        for dtype in (torch.float64, torch.float32):
            ref = block.to(dtype)
            tracer = Tracer(rank=r)
            mods = {"tp": (TensorParallelBlock.from_module(ref, group).to(dtype), x, w),   # (its qkv is
                    "sp": (SequenceParallelBlock.from_module(ref, group, tracer).to(dtype),    # made float32)
                           x.chunk(t, 1)[r], w.chunk(t, 1)[r])}
            for name, (m, xin, win) in mods.items():
                xin = xin.to(dtype).clone().requires_grad_()
                with SavedActivations() as act:
                    y = m(xin)
                res[name, dtype, "activations"] = act.live
                (y * win.to(dtype)).sum().backward()
                if name == "sp":
                    sync_sequence_parallel_grads(m)
                res[name, dtype] = (y.detach(), xin.grad, {k: p.grad for k, p in m.named_parameters()})
            res["events", dtype] = tracer.take()
        out.append(res)
    return out


@pytest.fixture(scope="module")
def runs(world):
    return run_all(world, sp_run)


def reference(dtype):
    from ddnb.models import Block, GPTConfig

    torch.manual_seed(0)
    block = Block(GPTConfig(d_model=D, n_heads=HEADS, seq_len=S)).to(dtype)
    x, w = torch.randn(B, S, D).to(dtype).requires_grad_(), torch.randn(B, S, D).to(dtype)
    (block(x) * w).sum().backward()
    y = block(x).detach()
    return y, x.grad, dict(block.named_parameters())


def test_equal_to_the_unsharded_and_the_tensor_parallel_block(runs):
    y, dx, params = reference(torch.float64)
    assert sorted(res["t"] for res in runs if res["r"] == 0) == [2, 3, 4]
    for res in runs:
        t, r = res["t"], res["r"]
        sp_y, sp_dx, sp_grads = res["sp", torch.float64]
        _, _, tp_grads = res["tp", torch.float64]
        assert (sp_y - y.chunk(t, 1)[r]).abs().max() < 1e-5
        assert (sp_dx - dx.chunk(t, 1)[r]).abs().max() < 1e-5
        assert tp_grads.keys() == sp_grads.keys()
        for name, g in sp_grads.items():
            assert (g - tp_grads[name]).abs().max() < 1e-5, (t, r, name)
            if name.startswith("ln"):
                assert (g - params[name].grad).abs().max() < 1e-5, (t, r, name)


def test_collectives_from_the_trace(runs):
    for res in runs:
        t, events = res["t"], res["events", torch.float64]
        assert count_collectives(events) == {("all_gather", "forward"): 2, ("reduce_scatter", "forward"): 2,
                                             ("all_gather", "backward"): 4, ("reduce_scatter", "backward"): 2}
        # every collective moves one (B, S/t, D) shard of float64 per rank
        assert {e["nbytes"] for e in events if e["kind"] == "collective"} == {B * S // t * D * 8}


def test_activation_memory_per_rank_against_table_2(runs):
    for res in runs:
        t = res["t"]
        for name, sp in (("tp", False), ("sp", True)):
            measured = res[name, torch.float32, "activations"]
            ours = activation_formula(S, B, D, HEADS, t, sp, paper=False, small_terms=True)
            assert measured == ours, (name, t, measured, ours)
            assert measured - activation_formula(S, B, D, HEADS, t, sp, paper=False) == \
                16 * S * B / (t if sp else 1) + S * S                  # LayerNorm stats + causal mask
        assert res["sp", torch.float32, "activations"] < res["tp", torch.float32, "activations"]


def test_formula_is_the_papers_table_2():
    s, b, h, a, t = 2048, 1, 12288, 96, 8                      # GPT-3 175B's layer (Table 3), t = 8
    assert activation_formula(s, b, h, a, t, False) == s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
    assert activation_formula(s, b, h, a, t, True) == s * b * h * (34 / t + 5 * a * s / (h * t))
    assert activation_formula(s, b, h, a, 1, False) == activation_formula(s, b, h, a, 1, True) == \
        s * b * h * (34 + 5 * a * s / h)
    with pytest.raises(ValueError, match="t=0: need an integer >= 1"):
        activation_formula(s, b, h, a, 0, True)
