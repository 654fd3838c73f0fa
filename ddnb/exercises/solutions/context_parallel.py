"""Solutions of the exercises of `notebooks/13_sequence_context_expert.ipynb` (ddnb.exercises.context_parallel)."""
import torch

# Exercise 1: Ulysses, B=1, H=8, S=64, D=16, N=4, float32: a shard is 1·8·16·16·4 = 8192 bytes.
# Forward sends (N-1)/N of 4 shards (q, k, v out; the output back): (3/4)·4·8192 = 24576;
# backward the same again (dO out; dq, dk, dv back)
ulysses_bytes = 2 * 3 / 4 * 4 * 8192


def merge(out, lse, block_out, block_lse):
    """Exercise 2: the online-softmax merge of two partial attentions."""
    new = torch.logaddexp(lse, block_lse)
    return out * torch.exp(lse - new)[..., None] + block_out * torch.exp(block_lse - new)[..., None], new


# Exercise 3: counts (9, 3, 2, 2), top-1, capacity factor 1.0: T = 16, E = 4, capacity
# ceil(1.0 · 1 · 16 / 4) = 4: expert 0 drops 9 - 4 = 5, the others fit
dropped = 5
