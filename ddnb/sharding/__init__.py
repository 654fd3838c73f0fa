"""Memory sharding: ZeRO (Rajbhandari et al. 2020) from scratch on torch.distributed,
naive first, then better, each stage one module:

    flat.py        FlatUnit, shard_numel      a layer's parameters as one flat buffer, N equal shards
    zero1.py       ZeroStage1, ring_bytes_sent
                                              Adam state sharded; reduce-scatter, step my shard, all-gather
    zero2.py       ZeroStage2                 + gradients reduce-scattered layer by layer in backward
    zero3.py       ZeroStage3                 + parameters sharded, all-gathered on demand (hooks)
    compare.py     train_gpt, expected_state_bytes
                                              the same GPT under DDP, ZeRO 1/2/3 and torch FSDP2
    activation_checkpointing.py  checkpoint_blocks, activation_cost
                                              activation checkpointing: memory against recompute

Taught in `notebooks/11_memory_sharding.ipynb`; the paper's formulas are
`ddnb.cost.zero_memory` (bytes held) and `ddnb.cost.zero_comm_bytes` (bytes sent).
"""
from ddnb.sharding.activation_checkpointing import activation_cost, checkpoint_blocks
from ddnb.sharding.compare import STRATEGIES, expected_state_bytes, fsdp2_memory, train_gpt
from ddnb.sharding.flat import FlatUnit, default_units, shard_numel
from ddnb.sharding.zero1 import ZeroStage1, adam_state_bytes, ring_bytes_sent
from ddnb.sharding.zero2 import ZeroStage2
from ddnb.sharding.zero3 import ZeroStage3

__all__ = ["FlatUnit", "STRATEGIES", "ZeroStage1", "ZeroStage2", "ZeroStage3", "activation_cost",
           "adam_state_bytes", "checkpoint_blocks", "default_units", "expected_state_bytes", "fsdp2_memory",
           "ring_bytes_sent", "shard_numel", "train_gpt"]
