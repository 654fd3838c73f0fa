"""ddnb.tensor_parallel: every tensor-parallel module's forward and all its gradients equal
the unsharded reference's (1e-5) for t in {1, 2, 3, 4}: column / row linear (each mode),
the MLP, attention with heads split, the block, the whole GPT with a vocab-parallel
embedding and cross-entropy; the all-reduces counted from the traces (2 forward + 2
backward per block); per-rank weight memory 1/t; the vocab-parallel cross-entropy equals
F.cross_entropy; torch's ColwiseParallel / RowwiseParallel on a DeviceMesh give the same
numbers; bad sizes raise ValueError before any collective; dp × tp training on 4 ranks
follows the single-process run.

All distributed tests run on one 4-rank world; a test for t ranks makes the group of
ranks [0, t) (every rank calls new_group, as it must) and ranks >= t return None.
"""
import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ddnb.memory import model_memory
from ddnb.models import Block, GPTConfig, gpt, lm_loss, synthetic_task
from ddnb.tensor_parallel import (ColumnParallelLinear, RowParallelLinear, TensorParallelAttention,
                                  TensorParallelBlock, TensorParallelGPT, TensorParallelMLP,
                                  VocabParallelEmbedding, count_collectives, gathered_cross_entropy,
                                  qkv_shard_order, vocab_parallel_cross_entropy)
from ddnb.trace import Tracer

TOL = 1e-5
TS = [1, 2, 3, 4]
# every size divisible by 1, 2, 3 and 4: d=24, 12 heads (hs=2), hidden 48, vocab 24
CFG = GPTConfig(vocab_size=24, seq_len=8, d_model=24, n_heads=12, n_layers=2, mlp_ratio=2)


# ---------------------------------------------------------------- shared by the ranks
def tp_group(t):
    """The group of ranks [0, t), made on every rank; None on the ranks outside it."""
    group = dist.new_group(list(range(t)))
    return group if dist.get_rank() < t else None


def grads_as_module(module):
    """A copy of `module` whose parameters hold its gradients: sharding it with the same
    from_module / from_linear gives the reference gradient of each shard."""
    g = copy.deepcopy(module)
    with torch.no_grad():
        for p, q in zip(module.parameters(), g.parameters()):
            q.copy_(p.grad)
    return g


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def param_grads(module) -> dict:
    return {n: p.grad.detach().clone() for n, p in module.named_parameters()}


def params(module) -> dict:
    return {n: p.detach().clone() for n, p in module.named_parameters()}


def compare(ref, build, x, t):
    """Run ref and build(ref, group, tracer) (its TP version, replicated output) on x with
    the loss Σ y²; the forward, input-gradient and parameter-gradient differences, and the
    collectives of the TP run (forward only, and all)."""
    group = tp_group(t)
    if group is None:
        return None
    tracer = Tracer()
    tp = build(ref, group, tracer)
    x_ref, x_tp = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ref = ref(x_ref)
    (y_ref ** 2).sum().backward()
    y_tp = tp(x_tp)
    fwd_events = list(tracer.events)
    (y_tp ** 2).sum().backward()
    expected = params(build(grads_as_module(ref), group, None))
    out = {"forward": (y_tp - y_ref).abs().max().item(),
           "param_grads": max_diff(param_grads(tp), expected),
           "fwd": count_collectives(fwd_events), "all": count_collectives(tracer.take())}
    out["input_grad"] = (x_tp.grad - x_ref.grad).abs().max().item()
    return out


def linear_case(kind, t):
    torch.manual_seed(0)
    x = torch.randn(3, 5, 12)
    if kind == "column":                 # replicated in, shard out
        return _column(nn.Linear(12, 24), x, t)
    if kind == "column_gathered":
        ref = nn.Linear(12, 24)
        return compare(ref, lambda m, g, tr: ColumnParallelLinear.from_linear(m, g, gather_output=True, tracer=tr),
                       x, t)
    if kind == "row_replicated_input":
        ref = nn.Linear(12, 6)
        return compare(ref, lambda m, g, tr: RowParallelLinear.from_linear(m, g, input_is_parallel=False, tracer=tr),
                       x, t)
    if kind == "mlp_row_of_column":      # Row(gelu(Column(x))): the default modes composed
        ref = nn.Sequential(nn.Linear(12, 24), nn.GELU(), nn.Linear(24, 12))
        def build(m, g, tr):
            return nn.Sequential(ColumnParallelLinear.from_linear(m[0], g, tracer=tr), nn.GELU(),
                                 RowParallelLinear.from_linear(m[2], g, tracer=tr))
        return compare(ref, build, x, t)
    raise ValueError(kind)


def _column(ref, x, t):
    """The column layer's output is a shard: compare it with the reference's slice, and
    feed the reference's loss gradient slice back."""
    group = tp_group(t)
    if group is None:
        return None
    col = ColumnParallelLinear.from_linear(ref, group)
    xr, xt = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ref, y_tp = ref(xr), col(xt)
    n, r = 24 // t, dist.get_rank(group)
    w = torch.arange(24.0) / 24                               # loss Σ w_j y_j²: distinct weight per output
    (w * y_ref ** 2).sum().backward()
    (w[r * n:(r + 1) * n] * y_tp ** 2).sum().backward()       # this rank's part of the same loss
    expected = params(ColumnParallelLinear.from_linear(grads_as_module(ref), group))
    return {"forward": (y_tp - y_ref[..., r * n:(r + 1) * n]).abs().max().item(),
            "input_grad": (xt.grad - xr.grad).abs().max().item(),
            "param_grads": max_diff(param_grads(col), expected)}


# ---------------------------------------------------------------- tests
@pytest.mark.parametrize("t", TS)
@pytest.mark.parametrize("kind", ["column", "column_gathered", "row_replicated_input", "mlp_row_of_column"])
def test_linear_layers_equal_reference(world, kind, t):
    res = world(4).run(linear_case, kind, t)
    for r in res[:t]:
        assert r["forward"] < TOL and r["input_grad"] < TOL and r["param_grads"] < TOL, r
    assert res[t:] == [None] * (4 - t)
    expected = {"column_gathered": {("all_gather", "forward"): 1, ("all_reduce", "backward"): 1},    # gather; f
                "row_replicated_input": {("all_reduce", "forward"): 1, ("all_gather", "backward"): 1},  # g; scatter
                "mlp_row_of_column": {("all_reduce", "forward"): 1, ("all_reduce", "backward"): 1}}     # g; f
    if kind in expected:
        assert all(r["all"] == (expected[kind] if t > 1 else {}) for r in res[:t])


def init_case(t):
    """Built from sizes and a seed (not from_linear), a layer holds its block of the
    nn.Linear that the same seed makes: Megatron's master weight, then split."""
    group = tp_group(t)
    if group is None:
        return None
    torch.manual_seed(5)
    ref = nn.Linear(12, 24)
    col = ColumnParallelLinear(12, 24, group=group, seed=5)
    row = RowParallelLinear(24, 12, group=group, seed=5)
    torch.manual_seed(5)
    ref_row = nn.Linear(24, 12)
    r, n = dist.get_rank(group), 24 // t
    mine = slice(r * n, (r + 1) * n)
    return (torch.equal(col.weight, ref.weight[mine]) and torch.equal(col.bias, ref.bias[mine])
            and torch.equal(row.weight, ref_row.weight[:, mine]) and torch.equal(row.bias, ref_row.bias))


@pytest.mark.parametrize("t", [1, 3])
def test_layers_built_from_a_seed_hold_their_block_of_the_master_weight(world, t):
    assert world(4).run(init_case, t)[:t] == [True] * t


def module_case(kind, t):
    torch.manual_seed(1)
    block = Block(CFG)
    x = torch.randn(2, CFG.seq_len, CFG.d_model)
    ref, cls = {"mlp": (block.mlp, TensorParallelMLP), "attention": (block.attn, TensorParallelAttention),
                "block": (block, TensorParallelBlock)}[kind]
    return compare(ref, lambda m, g, tr: cls.from_module(m, g, tr), x, t)


@pytest.mark.parametrize("t", TS)
@pytest.mark.parametrize("kind", ["mlp", "attention", "block"])
def test_transformer_modules_equal_reference(world, kind, t):
    res = world(4).run(module_case, kind, t)
    for r in res[:t]:
        assert r["forward"] < TOL and r["input_grad"] < TOL and r["param_grads"] < TOL, r
    per_module = {"mlp": 1, "attention": 1, "block": 2}[kind]
    expected = {} if t == 1 else {("all_reduce", "forward"): per_module, ("all_reduce", "backward"): per_module}
    for r in res[:t]:
        assert r["all"] == expected
        assert r["fwd"] == ({} if t == 1 else {("all_reduce", "forward"): per_module})


def gpt_case(t):
    group = tp_group(t)
    if group is None:
        return None
    ref = gpt(CFG, seed=3)
    idx, targets = synthetic_task(CFG, batch_size=4, steps=1, seed=1)[0]
    loss_ref = lm_loss(ref(idx), targets)
    loss_ref.backward()
    tracer = Tracer()
    tp = TensorParallelGPT.from_module(ref, group, tracer)
    loss = tp.loss(idx, targets)
    fwd = count_collectives(tracer.take())
    loss.backward()
    bwd = count_collectives(tracer.take())
    expected = params(TensorParallelGPT.from_module(grads_as_module(ref), group))
    return {"loss": abs(loss.item() - loss_ref.item()), "param_grads": max_diff(param_grads(tp), expected),
            "fwd": fwd, "bwd": bwd}


@pytest.mark.parametrize("t", TS)
def test_gpt_loss_and_all_gradients_equal_reference(world, t):
    res = world(4).run(gpt_case, t)
    L = CFG.n_layers
    for r in res[:t]:
        assert r["loss"] < TOL and r["param_grads"] < TOL, r
        if t > 1:
            # forward: embedding g, 2 g per block, 3 in the cross-entropy (max, target, sum-exp);
            # backward: 2 f per block, the output layer's f; nothing for the cross-entropy
            assert r["fwd"] == {("all_reduce", "forward"): 1 + 2 * L + 3}
            assert r["bwd"] == {("all_reduce", "backward"): 2 * L + 1}
        else:
            assert r["fwd"] == {} and r["bwd"] == {}


def memory_case(t):
    group = tp_group(t)
    if group is None:
        return None
    torch.manual_seed(0)
    block = Block(CFG)
    tp = TensorParallelBlock.from_module(block, group)
    linear_weights = lambda m: sum(p.numel() * p.element_size() for n, p in m.named_parameters()  # noqa: E731
                                   if n.endswith("weight") and p.dim() == 2)
    return {"ref": model_memory(block)["parameters"], "tp": model_memory(tp)["parameters"],
            "ref_w": linear_weights(block), "tp_w": linear_weights(tp)}


@pytest.mark.parametrize("t", [2, 3, 4])
def test_weight_memory_per_rank_is_one_over_t(world, t):
    for r in world(4).run(memory_case, t)[:t]:
        assert r["tp_w"] * t == r["ref_w"]                    # every weight matrix: exactly 1/t
        # what stays replicated: 2 LayerNorms (2·2d) and the two row layers' biases (2d)
        d = CFG.d_model
        replicated = 4 * (4 * d + 2 * d)
        sharded = r["ref"] - replicated
        assert r["tp"] == replicated + sharded // t
        assert r["tp"] / r["ref"] < 1 / t + replicated / r["ref"]


def ce_case(t):
    group = tp_group(t)
    if group is None:
        return None
    torch.manual_seed(0)
    V, n = 24, 24 // t
    logits = torch.randn(5, 7, V) * 3
    targets = torch.randint(0, V, (5, 7))
    targets[0, :3] = -100
    ref_in = logits.clone().requires_grad_()
    ref = F.cross_entropy(ref_in.reshape(-1, V), targets.reshape(-1), ignore_index=-100)
    ref.backward()
    r = dist.get_rank(group)
    out = {}
    for name, fn in (("vocab_parallel", vocab_parallel_cross_entropy), ("gathered", gathered_cross_entropy)):
        tracer = Tracer()
        local = logits[..., r * n:(r + 1) * n].clone().requires_grad_()
        loss = fn(local, targets, group, tracer=tracer)
        loss.backward()
        ev = tracer.take()
        out[name] = {"loss": abs(loss.item() - ref.item()),
                     "grad": (local.grad - ref_in.grad[..., r * n:(r + 1) * n]).abs().max().item(),
                     "ops": count_collectives(ev), "nbytes": sum(e["nbytes"] for e in ev)}
    return out


@pytest.mark.parametrize("t", TS)
def test_vocab_parallel_cross_entropy_equals_f_cross_entropy(world, t):
    for r in world(4).run(ce_case, t)[:t]:
        for name in ("vocab_parallel", "gathered"):
            assert r[name]["loss"] < TOL and r[name]["grad"] < TOL, (name, r)
        if t > 1:
            assert r["vocab_parallel"]["ops"] == {("all_reduce", "forward"): 3}
            assert r["vocab_parallel"]["nbytes"] == 3 * 35 * 4           # 3 all-reduces of N=35 floats
            assert r["gathered"]["ops"] == {("all_gather", "forward"): 1}
            assert r["gathered"]["nbytes"] == 35 * (24 // t) * 4         # my slice of the logits


def embedding_case(t):
    group = tp_group(t)
    if group is None:
        return None
    torch.manual_seed(0)
    ref = nn.Embedding(24, 6)
    idx = torch.randint(0, 24, (3, 8))
    emb = VocabParallelEmbedding.from_embedding(ref, group)
    w = torch.randn(3, 8, 6)
    y_ref, y = ref(idx), emb(idx)
    (w * y_ref).sum().backward()
    (w * y).sum().backward()
    expected = params(VocabParallelEmbedding.from_embedding(grads_as_module(ref), group))
    return {"forward": (y - y_ref).abs().max().item(), "param_grads": max_diff(param_grads(emb), expected),
            "rows": emb.weight.shape[0]}


@pytest.mark.parametrize("t", TS)
def test_vocab_parallel_embedding_equals_reference(world, t):
    for r in world(4).run(embedding_case, t)[:t]:
        assert r["forward"] < TOL and r["param_grads"] < TOL and r["rows"] == 24 // t


def torch_tp_case(t):
    group = tp_group(t)
    if group is None:
        return None
    from ddnb.tensor_parallel.torch_tp import local_grads, torch_tp_mlp

    torch.manual_seed(0)
    block = Block(CFG)
    x = torch.randn(2, CFG.seq_len, CFG.d_model)
    ours, theirs = TensorParallelMLP.from_module(block.mlp, group), torch_tp_mlp(block.mlp, group)
    xo, xt = x.clone().requires_grad_(), x.clone().requires_grad_()
    yo, yt = ours(xo), theirs(xt)
    (yo ** 2).sum().backward()
    (yt ** 2).sum().backward()
    shapes = {n: tuple(g.shape) for n, g in local_grads(theirs).items()}
    return {"forward": (yo - yt).abs().max().item(), "input_grad": (xo.grad - xt.grad).abs().max().item(),
            "param_grads": max_diff(param_grads(ours), local_grads(theirs)), "shapes": shapes}


@pytest.mark.parametrize("t", [2, 4])
def test_equal_to_torch_colwise_rowwise_parallel(world, t):
    h, d = CFG.mlp_ratio * CFG.d_model, CFG.d_model
    for r in world(4).run(torch_tp_case, t)[:t]:
        assert r["forward"] < TOL and r["input_grad"] < TOL and r["param_grads"] < TOL, r
        assert r["shapes"] == {"fc.weight": (h // t, d), "fc.bias": (h // t,), "proj.weight": (d, h // t),
                               "proj.bias": (d,)}


def bad_input_case():
    """Only rank 0 builds, in a group of 3 (the others never join any collective): any
    communication before the check would block until the world's timeout."""
    group = tp_group(3)
    if dist.get_rank() != 0:
        return None
    errors = {}
    cases = {
        "column": lambda: ColumnParallelLinear(4, 10, group=group),
        "row": lambda: RowParallelLinear(10, 4, group=group),
        "heads": lambda: TensorParallelAttention.from_module(Block(GPTConfig(d_model=24, n_heads=4)).attn, group),
        "hidden": lambda: TensorParallelMLP.from_module(Block(GPTConfig(d_model=32, n_heads=4)).mlp, group),
        "vocab": lambda: VocabParallelEmbedding(16, 4, group=group),
        "gpt": lambda: TensorParallelGPT.from_module(gpt(GPTConfig(vocab_size=16, d_model=24, n_heads=6)), group),
    }
    for name, fn in cases.items():
        try:
            fn()
            errors[name] = None
        except ValueError as e:
            errors[name] = str(e)
    return errors


def test_bad_sizes_raise_before_any_collective(world):
    errors = world(4).run(bad_input_case, timeout=30)[0]
    assert "out_features=10" in errors["column"] and "tp=3" in errors["column"]
    assert "in_features=10" in errors["row"] and "tp=3" in errors["row"]
    assert "n_heads=4" in errors["heads"] and "tp=3" in errors["heads"]
    assert "fc.out_features" in errors["hidden"] and "128" in errors["hidden"]
    assert "vocabulary size" in errors["vocab"] and "16" in errors["vocab"]
    assert "vocab_size=16" in errors["gpt"]


def test_qkv_shard_order_keeps_whole_heads():
    order = qkv_shard_order(8, 4, 2).tolist()      # d=8, 4 heads of 2, t=2: rank 0 heads 0-1
    assert order[:12] == [0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19]
    assert sorted(order) == list(range(24))
    with pytest.raises(ValueError, match="n_heads=4"):
        qkv_shard_order(12, 4, 3)


def without_key_bias(p: dict) -> dict:
    """The parameters, with the key part of each fused qkv bias left out: its true gradient
    is exactly 0 (q·(k + b) adds the same q·b to every score of a query's row, and softmax
    ignores a constant shift), so Adam, which divides by √v, turns the rounding noise there
    into full-size steps in either run: the key bias is not determined by the math."""
    out = dict(p)
    for name, v in p.items():
        if name.endswith("attn.qkv.bias"):
            n = v.shape[0] // 3
            out[name] = torch.cat([v[:n], v[2 * n:]])                       # q and v parts
    return out


def dp_tp_case(steps, optimizer, lr):
    from ddnb.process_grid import ProcessGrid
    from ddnb.tensor_parallel import train_dp_tp, train_reference

    grid = ProcessGrid(dp=2, tp=2)
    out = train_dp_tp(grid, CFG, steps=steps, batch_size=8, lr=lr, optimizer=optimizer)
    ref = train_reference(CFG, steps=steps, batch_size=8, lr=lr, optimizer=optimizer)
    expected = params(TensorParallelGPT.from_module(ref["model"], grid.group("tp")))
    got = params(out["model"])
    return {"params": max_diff(got, expected),
            "params_but_key_bias": max_diff(without_key_bias(got), without_key_bias(expected)),
            "losses": max(abs(a - b) for a, b in zip(out["losses"], ref["losses"])),
            "loss_curve": out["losses"], "coords": tuple(grid.coords())}


@pytest.mark.parametrize("optimizer,lr,steps", [("sgd", 0.1, 6), ("adam", 1e-2, 20)])
def test_dp_x_tp_training_equals_single_process(world, optimizer, lr, steps):
    res = world(4).run(dp_tp_case, steps, optimizer, lr)
    assert [r["coords"] for r in res] == [(0, 0, 0, 0, 0), (0, 0, 1, 0, 0), (1, 0, 0, 0, 0), (1, 0, 1, 0, 0)]   # dp, pp, tp, cp, ep
    for r in res:
        assert r["losses"] < TOL, r
        if optimizer == "sgd":
            assert r["params"] < TOL, r
        else:
            assert r["params_but_key_bias"] < TOL, r
    if optimizer == "adam":
        losses = res[0]["loss_curve"]
        assert sum(losses[-5:]) < sum(losses[:5])                # the loss falls


def test_tp_plots_draw_from_plain_data():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ddnb.viz import TensorParallelExplorer, plot_shard_layout, plot_tp_traffic

    fig = plot_shard_layout({"fc": [[0, 0], [1, 1]], "proj": [[0, 1], [0, 1]]}, title="t=2")
    assert len(fig.axes) == 2
    plt.close(fig)
    with pytest.raises(ValueError, match="layouts is empty"):
        plot_shard_layout({})
    ax = plot_tp_traffic({1: {}, 2: {"forward": 2048, "backward": 1024}})
    assert [tick.get_text() for tick in ax.get_xticklabels()] == ["t=1", "t=2"]
    plt.close(ax.figure)
    mem = {"parameters": 400, "gradients": 400, "optimizer": 800, "activations": 100}
    half = {k: v // 2 for k, v in mem.items()}
    explorer = TensorParallelExplorer({1: {"memory": [mem], "traffic": {}},
                                       2: {"memory": [half, half], "traffic": {"forward": 64, "backward": 64}}})
    assert explorer.image.value[:4] == b"\x89PNG" and "0.50 of the t=1 memory" in explorer.label.value
    explorer.slider.value = 1
    assert "t=1: rank 0 holds 1.00" in explorer.label.value
