"""Bytes on the wire, counted rather than computed: one of ddnb's all-reduces run on this
rank with the trace emptied first, and the payload of its "send" events summed
(`ddnb.trace.bytes_sent`). Call it on every rank at once:

    grads = torch.zeros(9_610)                                # 38,440 B of float32 gradients
    sent = cluster.run(allreduce_bytes_sent, "ring", grads)   # [57656, 57660, 57664, 57660]

The ring sends 2(N-1)/N · S per rank on average (Patarasuk & Yuan 2009, Sec. 3; the
formula is `ddnb.cost.allreduce_bytes_per_rank`); rank r sends every chunk but its own in
the reduce-scatter and every chunk but rank r+1's in the all-gather, so when N does not
divide the element count (`chunk_bounds`: the first chunks are one element longer) the
ranks differ by a few bytes. Used by the "predict" exercise 07.3 of
`notebooks/07_horovod.ipynb`, whose answer is this measurement, not the formula.
"""
from __future__ import annotations

import torch

from ddnb._checks import Checks
from ddnb.trace import take_events


def allreduce_bytes_sent(algorithm: str, tensor: torch.Tensor, group=None) -> int:
    """Sum-all-reduce a copy of `tensor` (any shape, floating point) with ddnb's `algorithm`
    (a key of `ddnb.collectives.ALLREDUCES`: "naive", "tree", "ring", "halving_doubling")
    over `group`, check=False (only the algorithm's own messages, no argument check), and
    return the bytes this rank sent, from its trace. Bad arguments raise on every rank
    alike, before any message."""
    from ddnb.collectives import ALLREDUCES
    from ddnb.collectives.devices import rank_device

    with Checks("allreduce_bytes_sent") as check:
        check.choice("algorithm", algorithm, list(ALLREDUCES))
        if check.rule(isinstance(tensor, torch.Tensor), f"tensor must be a torch.Tensor, got {type(tensor).__name__}"):
            check.rule(tensor.is_floating_point(), f"tensor has dtype {tensor.dtype}: need a floating-point tensor")
    x = tensor.detach().to(rank_device(), copy=True)
    take_events()                                                  # start from an empty trace
    ALLREDUCES[algorithm](x, group=group, check=False)
    return sum(e["nbytes"] for e in take_events() if e["kind"] == "send")
