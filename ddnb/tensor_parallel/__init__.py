"""Tensor parallelism (Megatron-LM, Shoeybi et al. 2019, arXiv 1909.08053): every weight
matrix of a layer split across the t ranks of a tensor-parallel group, with the f / g
operators keeping forward and backward equal to the unsharded model's.

    comms.py        copy_to_tp (f), reduce_from_tp (g), gather_from_tp, scatter_to_tp,
                    count_collectives                  traced, explicit group
    layers.py       ColumnParallelLinear, RowParallelLinear   .from_linear(linear, group)
    transformer.py  TensorParallelMLP, TensorParallelAttention (heads split),
                    TensorParallelBlock, TensorParallelGPT     .from_module(reference, group)
    embedding.py    VocabParallelEmbedding, vocab_parallel_cross_entropy (logits never
                    gathered), gathered_cross_entropy (the naive way)
    sequence.py     SequenceParallelBlock: LayerNorms on sequence shards, all-reduces
                    split into all-gather + reduce-scatter (Korthikanti et al. 2022)
    hybrid.py       train_dp_tp on a ddnb.ProcessGrid(dp, tp), train_reference
    torch_tp.py     torch_tp_mlp: the same MLP with torch.distributed.tensor.parallel
    demo.py         the notebook's harnesses: check_against_reference, traced_step,
                    cross_entropies, measure_memory, against_torch

Taught in `notebooks/10_tensor_parallelism.ipynb`.
"""
from ddnb.tensor_parallel.comms import (copy_to_tp, count_collectives, gather_from_tp, reduce_from_tp,
                                        scatter_to_tp)
from ddnb.tensor_parallel.embedding import (VocabParallelEmbedding, gathered_cross_entropy,
                                            vocab_parallel_cross_entropy)
from ddnb.tensor_parallel.hybrid import allreduce_gradients, train_dp_tp, train_reference
from ddnb.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from ddnb.tensor_parallel.sequence import SequenceParallelBlock, activation_formula, sync_sequence_parallel_grads
from ddnb.tensor_parallel.transformer import (TensorParallelAttention, TensorParallelBlock, TensorParallelGPT,
                                              TensorParallelMLP, qkv_shard_order)

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "SequenceParallelBlock", "activation_formula",
           "sync_sequence_parallel_grads", "TensorParallelAttention", "TensorParallelBlock",
           "TensorParallelGPT", "TensorParallelMLP", "VocabParallelEmbedding", "allreduce_gradients", "copy_to_tp",
           "count_collectives", "gather_from_tp", "gathered_cross_entropy", "qkv_shard_order", "reduce_from_tp",
           "scatter_to_tp", "train_dp_tp", "train_reference", "vocab_parallel_cross_entropy"]
