"""Small models for the notebooks, built the same on every rank from a seed.

    model = mlp((64, 128, 10), seed=0)       # 64 -> 128 -> ReLU -> 10
    flat = flat_params(model)                 # (9610,) all parameters, in model order
    load_flat(model, flat)                    # and back
    accuracy(model, test)                     # fraction of test examples classified right

A distributed run ships parameters as one flat vector (a parameter server's pull and
push, an all-reduce's buffer): `flat_params` / `load_flat` are that view, in the order of
`model.parameters()`. Used from `notebooks/04_parameter_server.ipynb` on.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ddnb._checks import Checks


def mlp(sizes=(64, 128, 10), seed: int = 0, activation=nn.ReLU, dropout: float = 0.0) -> nn.Sequential:
    """A multi-layer perceptron Linear(sizes[0], sizes[1]) -> activation [-> Dropout] -> ... ->
    Linear(sizes[-2], sizes[-1]) (no activation after the last layer: it outputs logits),
    initialized by PyTorch's defaults under `seed` without touching the global RNG. With
    dropout > 0 each hidden activation is followed by nn.Dropout(dropout), which draws from
    the global RNG in training mode."""
    sizes = tuple(sizes)
    with Checks("mlp") as check:
        check.integers("sizes", sizes, min=1, count=2, why=" (input, ..., output)")
        check.number("dropout", dropout, min=0, below=1, why=" (a probability)")
    layers = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            layers.append(nn.Linear(a, b))
            if i < len(sizes) - 2:
                layers.append(activation())
                if dropout > 0:
                    layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers)


def flat_params(model: nn.Module) -> torch.Tensor:
    """All parameters as one new flat vector (numel,), in `model.parameters()` order."""
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def flat_grads(model: nn.Module) -> torch.Tensor:
    """All parameter gradients as one flat vector (numel,), zeros where a grad is None."""
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                      for p in model.parameters()])


def load_flat(model: nn.Module, flat: torch.Tensor) -> nn.Module:
    """Copy the flat vector (numel,) into the model's parameters, in place; returns the model.
    The parameters stay on their device and dtype (`flat` is moved there first: torch's
    vector_to_parameters would otherwise move them to `flat`'s)."""
    numel = sum(p.numel() for p in model.parameters())
    if flat.numel() != numel:
        raise ValueError(f"flat vector has {flat.numel()} elements, the model has {numel} parameters")
    first = next(model.parameters())
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(flat.reshape(-1).to(first.device, first.dtype), model.parameters())
    return model


@torch.no_grad()
def accuracy(model: nn.Module, dataset) -> float:
    """Fraction of `dataset` (x, y) whose arg-max logit is the label."""
    x, y = dataset
    return (model(x).argmax(-1) == y).float().mean().item()


# --------------------------------------------------------------------------------------
# A small GPT (the shape of nanoGPT, Radford et al. 2019 "Language Models are Unsupervised
# Multitask Learners", Sec. 2.3, on the Transformer decoder of Vaswani et al. 2017), built as
# an nn.Sequential(Embedding, Block, ..., Block, Head) so that it splits into pipeline or
# model-parallel stages by slicing: gpt(cfg)[a:b] is a stage. Taught in
# `notebooks/08_model_parallelism.ipynb` (and split again in 09 and 10).
#
#     cfg = GPTConfig()                                   # V=16, T=16, d=32, 4 heads, 4 layers
#     model = gpt(cfg, seed=0)
#     idx, targets = synthetic_task(cfg, batch_size=32, steps=1)[0]    # (32, 16) each
#     loss = lm_loss(model(idx), targets)
# --------------------------------------------------------------------------------------
IGNORE = -100  # target value that lm_loss skips (F.cross_entropy's ignore_index)


@dataclass
class GPTConfig:
    """Sizes of the small GPT: vocabulary V, context length T, width d, heads nh (d % nh == 0),
    blocks, and the MLP's hidden width as a multiple of d."""
    # Typed fields with defaults, as PSConfig's (parameter_server/config.py): alike in shape only.
    vocab_size: int = 16
    seq_len: int = 16
    d_model: int = 32
    n_heads: int = 4
    n_layers: int = 4
    mlp_ratio: int = 4

    def __post_init__(self):
        with Checks("GPTConfig") as check:
            if check.positive_ints(**vars(self)):
                check.rule(self.d_model % self.n_heads == 0, f"d_model({self.d_model}) must be divisible by "
                           f"n_heads({self.n_heads}): each head gets d_model / n_heads = "
                           f"{self.d_model / self.n_heads:g} channels")

    @property
    def head_size(self) -> int:
        return self.d_model // self.n_heads


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q kᵀ / √hs + M) v with M = -inf above the diagonal (a token sees only itself
    and earlier tokens): Vaswani et al. 2017, Sec. 3.2.1, Eq. (1), with the decoder's mask
    (Sec. 3.2.3). q, k, v: (B, nh, T, hs) -> (B, nh, T, hs). Written out, not fused, so
    that every intermediate autograd keeps is visible to `ddnb.memory.SavedActivations`."""
    T, hs = q.shape[-2], q.shape[-1]
    att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)                        # (B, nh, T, T)
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()      # (T, T)
    att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)            # (B, nh, T, T)
    return att @ v                                                         # (B, nh, T, hs)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention (Vaswani et al. 2017, Sec. 3.2.2): one Linear makes
    q, k and v (stacked in that order along its output dim, so rows [0:d] of qkv.weight are
    W_Q, [d:2d] W_K, [2d:3d] W_V), heads attend independently, proj mixes them. No dropout."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        d = config.d_model
        self.n_heads = config.n_heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)                              # 3 x (B, T, d)
        q, k, v = (t.view(B, T, self.n_heads, d // self.n_heads).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        y = causal_attention(q, k, v)                                      # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, d)                   # (B, T, d): heads side by side
        return self.proj(y)                                                # (B, T, d)


class MLP(nn.Module):
    """The position-wise feed-forward network (Vaswani et al. 2017, Sec. 3.3, Eq. (2)) with
    GELU (Hendrycks & Gimpel 2016) as in GPT: (B, T, d) -> (B, T, r·d) -> (B, T, d)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        d, h = config.d_model, config.mlp_ratio * config.d_model
        self.fc = nn.Linear(d, h)
        self.act = nn.GELU()
        self.proj = nn.Linear(h, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.act(self.fc(x)))                             # (B, T, d)


class Block(nn.Module):
    """A pre-LayerNorm Transformer block (GPT-2, Radford et al. 2019, Sec. 2.3):
    x = x + attn(ln1(x)); x = x + mlp(ln2(x)). (B, T, d) -> (B, T, d)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.d_model)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Embedding(nn.Module):
    """Token plus learned position embeddings: idx (B, T) int64 -> (B, T, d)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.seq_len = config.seq_len
        self.tok = nn.Embedding(config.vocab_size, config.d_model)
        self.pos = nn.Embedding(config.seq_len, config.d_model)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        if T > self.seq_len:
            raise ValueError(f"sequence length {T} is longer than the model's seq_len({self.seq_len})")
        pos = torch.arange(T, device=idx.device)                           # (T,)
        return self.tok(idx) + self.pos(pos)                               # (B, T, d)


class Head(nn.Module):
    """Final LayerNorm and the projection to vocabulary logits: (B, T, d) -> (B, T, V)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_f = nn.LayerNorm(config.d_model)
        self.out = nn.Linear(config.d_model, config.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln_f(x))                                      # (B, T, V)


def gpt(config: GPTConfig | None = None, seed: int = 0) -> nn.Sequential:
    """Sequential(Embedding, Block x n_layers, Head): n_layers + 2 layers to split into stages.
    Initialized as GPT-2 / nanoGPT do, under `seed` without touching the global RNG: weights
    N(0, 0.02), biases 0, and the projections that write into the residual stream scaled by
    1/√(2·n_layers) (Radford et al. 2019, Sec. 2.3)."""
    config = GPTConfig() if config is None else config
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = nn.Sequential(Embedding(config), *[Block(config) for _ in range(config.n_layers)], Head(config))
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * config.n_layers) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, mean=0.0, std=std)
    return model


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of next-token prediction over the (B·T) positions whose target is
    not IGNORE (-100). logits (B, T, V), targets (B, T) int64 -> scalar."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE)


def reversal_batch(config: GPTConfig, batch_size: int, step: int = 0, seed: int = 0):
    """One batch of the sequence-reversal task, a pure function of (step, seed).

    A sequence is k = seq_len // 2 random symbols a_1..a_k from {0..V-2}, the separator
    SEP = V-1, then the symbols reversed: a_1..a_k SEP a_k..a_1 (2k+1 tokens). The model
    reads the first seq_len of them (idx) and predicts each next one (targets = idx shifted
    by one); only the reversed half can be predicted, so every other target is IGNORE.
    A random guess scores ln(V-1) ≈ 2.71 nats; copying needs attention to position 2k-t,
    which a 2-layer model finds in a few hundred steps.
    Returns idx (B, T) int64 and targets (B, T) int64."""
    V, T = config.vocab_size, config.seq_len
    with Checks("reversal_batch") as check:
        check.rule(V >= 3 and T >= 2, f"the reversal task needs vocab_size >= 3 and seq_len >= 2, got "
                   f"vocab_size({V}), seq_len({T})")
        check.integer("batch_size", batch_size, min=1)
    k = T // 2
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    a = torch.randint(0, V - 1, (batch_size, k), generator=g)                      # (B, k)
    sep = torch.full((batch_size, 1), V - 1, dtype=torch.long)
    seq = torch.cat([a, sep, a.flip(1)], dim=1)                                     # (B, 2k+1)
    idx, targets = seq[:, :T], seq[:, 1:T + 1].clone()                              # (B, T) each
    targets[:, :k] = IGNORE                                                         # a_2..a_k, SEP: unpredictable
    return idx, targets


def synthetic_task(config: GPTConfig | None = None, batch_size: int = 32, steps: int = 100,
                   seed: int = 0) -> list:
    """`steps` batches [(idx, targets), ...] of the sequence-reversal task (`reversal_batch`),
    the same on every rank for the same seed: the training data of the GPT notebooks."""
    config = GPTConfig() if config is None else config
    with Checks("synthetic_task") as check:
        check.integer("batch_size", batch_size, min=1)
        check.integer("steps", steps, min=0)
    return [reversal_batch(config, batch_size, step, seed) for step in range(steps)]
