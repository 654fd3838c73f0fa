"""Context parallelism: a long sequence split across the ranks of a group, attention
computed without any rank holding the whole sequence's activations.

    allgather.py       the naive form first: all-gather K and V, attend with this rank's queries
    ulysses.py         DeepSpeed-Ulysses (Jacobs et al. 2023): all-to-all from sequence
                       shards to head shards around attention, and back
    ring_attention.py  ring attention (Liu et al. 2023): K/V blocks passed around the ring,
                       online-softmax merge, zig-zag balance for causal, backward included
    agree.py           the one cross-rank argument check before the first message
    timing.py          each scheme's forward (+ backward) time, real or on an emulated cluster

Taught in `notebooks/13_sequence_context_expert.ipynb`.
"""
from ddnb.context_parallel.allgather import allgather_attention, allgather_bytes_per_rank
from ddnb.context_parallel.ulysses import heads_to_seq, seq_to_heads, ulysses_attention, ulysses_bytes_per_rank
from ddnb.context_parallel.ring_attention import (LAYOUTS, attend_block, block_plan, gather_sequence, merge,
                                                  ring_attention, ring_bytes_per_rank, ring_work, split_sequence)

__all__ = ["LAYOUTS", "allgather_attention", "allgather_bytes_per_rank", "attend_block", "block_plan", "gather_sequence", "heads_to_seq", "merge", "ring_attention",
           "ring_bytes_per_rank", "ring_work", "seq_to_heads", "split_sequence", "ulysses_attention",
           "ulysses_bytes_per_rank"]
