"""ddnb.models: the small GPT against PyTorch references, its split into stages, and the
synthetic task it learns."""
import pytest
import torch
import torch.nn.functional as F

from ddnb.models import (IGNORE, Block, CausalSelfAttention, Embedding, GPTConfig, Head, causal_attention, gpt,
                         lm_loss, mlp, reversal_batch, synthetic_task)

CFG = GPTConfig(n_layers=2)


def test_gpt_is_embedding_blocks_head_with_shapes():
    model = gpt(CFG, seed=0)
    assert [type(m) for m in model] == [Embedding, Block, Block, Head]
    idx, _ = synthetic_task(CFG, batch_size=3, steps=1)[0]
    assert idx.shape == (3, CFG.seq_len) and idx.dtype == torch.long
    h = model[0](idx)
    assert h.shape == (3, CFG.seq_len, CFG.d_model)
    assert model[1](h).shape == h.shape
    assert model(idx).shape == (3, CFG.seq_len, CFG.vocab_size)
    assert model[1].attn.qkv.weight.shape == (3 * CFG.d_model, CFG.d_model)
    assert model[1].mlp.fc.out_features == CFG.mlp_ratio * CFG.d_model
    assert model[-1].out.bias is None


def test_same_seed_same_weights():
    a, b, c = gpt(CFG, seed=3), gpt(CFG, seed=3), gpt(CFG, seed=4)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a[1].attn.qkv.weight, c[1].attn.qkv.weight)


def test_attention_equals_torch_sdpa_and_multihead():
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 2, 4, 6, 5).unbind(0)                  # (B, nh, T, hs) each
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.allclose(causal_attention(q, k, v), ref, atol=1e-6)

    # the module against torch's MultiheadAttention with the same q/k/v/out weights
    attn = gpt(CFG, seed=0)[1].attn
    mha = torch.nn.MultiheadAttention(CFG.d_model, CFG.n_heads, batch_first=True)
    with torch.no_grad():
        mha.in_proj_weight.copy_(attn.qkv.weight)                   # rows q, k, v: the same stacking
        mha.in_proj_bias.copy_(attn.qkv.bias)
        mha.out_proj.weight.copy_(attn.proj.weight)
        mha.out_proj.bias.copy_(attn.proj.bias)
    x = torch.randn(2, CFG.seq_len, CFG.d_model)
    mask = torch.ones(CFG.seq_len, CFG.seq_len, dtype=torch.bool).triu(1)   # True = may not attend
    ref, _ = mha(x, x, x, attn_mask=mask, need_weights=False)
    assert torch.allclose(attn(x), ref, atol=1e-5)


def test_causal_future_tokens_do_not_change_past_logits():
    model = gpt(CFG, seed=0)
    idx, _ = synthetic_task(CFG, batch_size=2, steps=1)[0]
    changed = idx.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % CFG.vocab_size
    a, b = model(idx), model(changed)
    assert torch.allclose(a[:, :10], b[:, :10], atol=1e-6)
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_sequential_split_equals_whole_model():
    model = gpt(GPTConfig(), seed=0)
    idx, targets = synthetic_task(GPTConfig(), batch_size=4, steps=1)[0]
    whole = model(idx)
    x = idx
    for a, b in [(0, 2), (2, 4), (4, 6)]:                           # three stages of two layers
        x = model[a:b](x)
    assert torch.equal(x, whole)


def test_reversal_task_layout():
    cfg = GPTConfig(vocab_size=10, seq_len=8)
    idx, targets = reversal_batch(cfg, batch_size=5, step=2, seed=1)
    k, sep = 4, 9
    assert idx.shape == targets.shape == (5, 8)
    assert (idx[:, k] == sep).all() and (idx[:, :k] < sep).all()
    assert (targets[:, :k] == IGNORE).all()
    assert torch.equal(targets[:, k:], idx[:, :k].flip(1))          # the second half: reversed first half
    assert torch.equal(idx[:, k + 1:], idx[:, :k].flip(1)[:, :k - 1])
    again, _ = reversal_batch(cfg, batch_size=5, step=2, seed=1)
    assert torch.equal(idx, again)                                  # a pure function of (step, seed)
    assert not torch.equal(idx, reversal_batch(cfg, batch_size=5, step=3, seed=1)[0])
    assert len(synthetic_task(cfg, batch_size=2, steps=3)) == 3


def test_lm_loss_ignores_masked_targets():
    logits = torch.randn(2, 3, 5)
    targets = torch.tensor([[IGNORE, 1, 2], [IGNORE, IGNORE, 4]])
    keep = targets.reshape(-1) != IGNORE
    ref = F.cross_entropy(logits.reshape(-1, 5)[keep], targets.reshape(-1)[keep])
    assert torch.allclose(lm_loss(logits, targets), ref)


def test_gpt_learns_reversal():
    cfg = GPTConfig(n_layers=2)
    model = gpt(cfg, seed=0)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for idx, targets in synthetic_task(cfg, batch_size=32, steps=150, seed=0):
        loss = lm_loss(model(idx), targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    # chance is ln(15) = 2.71 nats; memorizing the symbol frequencies cannot beat it
    assert losses[0] > 2.5
    assert sum(losses[-10:]) / 10 < 0.5


def test_bad_configs_say_what_is_wrong():
    with pytest.raises(ValueError, match=r"d_model\(30\) must be divisible by n_heads\(4\)"):
        GPTConfig(d_model=30)
    with pytest.raises(ValueError, match="n_layers=0"):
        GPTConfig(n_layers=0)
    with pytest.raises(ValueError, match="longer than the model's seq_len"):
        gpt(CFG)(torch.zeros(1, CFG.seq_len + 1, dtype=torch.long))
    with pytest.raises(ValueError, match="batch_size=0"):
        synthetic_task(CFG, batch_size=0)
    with pytest.raises(ValueError, match=r"vocab_size\(2\)"):
        reversal_batch(GPTConfig(vocab_size=2), 1)
    assert CausalSelfAttention(CFG)(torch.zeros(1, 3, CFG.d_model)).shape == (1, 3, CFG.d_model)


def test_every_bad_size_is_named_at_once():
    with pytest.raises(ValueError) as info:
        GPTConfig(n_layers=0, d_model=True, mlp_ratio=2.0)
    assert all(w in str(info.value) for w in ("n_layers=0", "d_model=True", "mlp_ratio=2.0")), str(info.value)
    with pytest.raises(ValueError, match=r"^mlp: sizes=\(4, 0\): need at least 2 integers >= 1 \(input, \.\.\., "
                                         r"output\); dropout=1: need a number >= 0 and < 1 \(a probability\)$"):
        mlp((4, 0), dropout=1)
    with pytest.raises(ValueError, match=r"batch_size=0: need an integer >= 1; steps=-1: need an integer >= 0"):
        synthetic_task(CFG, batch_size=0, steps=-1)
