"""A small language-model-like task made here, with no download: next-token prediction on
token sequences drawn from one fixed random Markov chain over a vocabulary of V tokens,
learned by a tiny embedding + MLP model. Each worker draws its own sequences (its shard:
its own random stream of the same chain), so the workers' data differ and agree in law.

    chain = MarkovChain(vocab=64, seed=0)
    x, y = chain.batch(batch_size=16, length=32, rank=0, step=3)    # (B, L) int64 each, y = x shifted
    model = markov_mlp(vocab=64, width=64, hidden=128)              # (B, L) tokens -> (B, L, V) logits
    loss = next_token_loss(model(x), y)                             # cross entropy per token, nats

The chain: P = softmax(sharpness · Z) row by row, Z (V, V) standard normal, so each token
has a few likely successors; a sequence starts from the stationary distribution pi
(pi P = pi). No model can do better than the chain's entropy rate

    H = - sum_i pi_i sum_j P_ij log P_ij          (nats per token; Cover & Thomas, Eq. 4.27)

(`MarkovChain.entropy_rate`), the floor the loss curves of notebook 16 approach; a model
that predicts the uniform distribution scores log V. The model sees one token and predicts
the next (a bigram model is exactly enough), so a few hundred AdamW steps on a CPU bring the
loss most of the way from log V to H. Used by `ddnb.decentralized.diloco` (DiLoCo, streaming
DiLoCo and their DDP baseline) and taught in `notebooks/16b_slow_link.ipynb`.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

EVAL_RANK = 10_000   # the held-out stream: no worker's


class MarkovChain:
    """A fixed random first-order Markov chain over `vocab` tokens (the same for every
    rank that builds it with the same seed)."""

    def __init__(self, vocab: int = 64, sharpness: float = 3.0, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.vocab = vocab
        self.P = torch.softmax(sharpness * torch.randn(vocab, vocab, generator=g, dtype=torch.float64), dim=1)  # (V, V)
        pi = torch.full((vocab,), 1.0 / vocab, dtype=torch.float64)
        for _ in range(1000):                     # power iteration: pi P = pi
            pi = pi @ self.P
        self.pi = pi / pi.sum()                   # (V,)
        self.seed = seed

    @property
    def entropy_rate(self) -> float:
        """H = - sum_i pi_i sum_j P_ij log P_ij, nats per token: the lowest loss possible."""
        return float(-(self.pi[:, None] * self.P * self.P.log()).sum())

    def batch(self, batch_size: int, length: int, rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y), each (B, L) int64: batch `step` of worker `rank`'s stream, y[:, k] the token
        after x[:, k]. Deterministic in (seed, rank, step), so a one-process simulation of N
        workers draws what N processes draw."""
        g = torch.Generator().manual_seed(((self.seed * 100_003 + rank) * 1_000_003 + step) % (2 ** 63))
        tokens = [torch.multinomial(self.pi.float(), batch_size, replacement=True, generator=g)]   # (B,)
        P = self.P.float()
        for _ in range(length):
            tokens.append(torch.multinomial(P[tokens[-1]], 1, generator=g).squeeze(1))           # (B,)
        seq = torch.stack(tokens, dim=1)                                                            # (B, L+1)
        return seq[:, :-1], seq[:, 1:]

    def held_out(self, batch_size: int = 256, length: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch no worker trains on (the stream of rank EVAL_RANK): the final loss's."""
        return self.batch(batch_size, length, EVAL_RANK, 0)


def markov_mlp(vocab: int = 64, width: int = 64, hidden: int = 128, seed: int = 0) -> nn.Sequential:
    """Embedding(V, width) -> Linear(width, hidden) -> ReLU -> Linear(hidden, V): (B, L) tokens
    to (B, L, V) logits, the same initial weights for a seed (every worker starts alike).
    V·width + (width+1)·hidden + (hidden+1)·V parameters: 20,672 (82,688 bytes) by default."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Embedding(vocab, width), nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, vocab))


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross entropy (nats per token) of logits (B, L, V) against targets (B, L)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
