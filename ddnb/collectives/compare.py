"""Check an all-reduce written in a notebook cell against ddnb's version of the same
algorithm and against torch.distributed: the same values, the same messages.

    out = cluster.run(compare_allreduce, my_tree_allreduce, "tree")
    all(o["same_as_ddnb"] and o["same_as_torch"] for o in out)

Used by `notebooks/05_allreduce.ipynb`, where the binomial tree (Thakur, Rabenseifner &
Gropp 2005, Sec. 4) is written in a few lines with `ddnb.collectives.p2p.send`/`recv` and
then compared here with `ddnb.collectives.tree.tree_allreduce`.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ddnb._checks import Checks
from ddnb.trace import take_events


def _messages(events: list[dict]) -> list[tuple[str, int, int]]:
    """(kind, peer, bytes) of each traced message, in the order this rank made them."""
    return [(e["kind"], e["peer"], e["nbytes"]) for e in events if e["kind"] in ("send", "recv")]


def compare_allreduce(fn, algorithm: str = "tree", numel: int = 262_144) -> dict:
    """Run `fn(x)` (a sum all-reduce of the 1-D float32 x, in place, sending through
    `ddnb.collectives.p2p` so its messages are traced) and ddnb's `algorithm` on copies of
    the same random x of this rank (seeded by the rank), and `dist.all_reduce` on a third.
    Call it on every rank at once. Returns, for this rank:

        same_as_ddnb      torch.equal with ddnb's result (same additions, same order)
        same_messages     the same (send/recv, peer, bytes) messages, in the same order
        same_as_torch     allclose (1e-5) to dist.all_reduce
        bytes_sent        bytes fn sent (from the trace)
        ddnb_bytes_sent   bytes ddnb's version sent
    """
    from ddnb.collectives import ALLREDUCES
    from ddnb.collectives.devices import rank_device

    with Checks("compare_allreduce") as check:
        check.rule(callable(fn), f"fn must be a function, got {type(fn).__name__}")
        check.choice("algorithm", algorithm, list(ALLREDUCES))
        check.positive_ints(numel=numel)
    g = torch.Generator().manual_seed(dist.get_rank())
    x = torch.randn(numel, generator=g).to(rank_device())          # (numel,)
    theirs, expected = x.clone(), x.clone()
    dist.all_reduce(expected)
    take_events()                                                  # empty the trace
    fn(x)
    mine = take_events()
    ALLREDUCES[algorithm](theirs, check=False)                     # only the algorithm's messages
    ddnb = take_events()
    return {"same_as_ddnb": torch.equal(x, theirs), "same_messages": _messages(mine) == _messages(ddnb),
            "same_as_torch": torch.allclose(x, expected, rtol=1e-5, atol=1e-5),
            "bytes_sent": sum(e["nbytes"] for e in mine if e["kind"] == "send"),
            "ddnb_bytes_sent": sum(e["nbytes"] for e in ddnb if e["kind"] == "send")}
