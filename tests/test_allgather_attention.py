"""Naive context parallelism (all-gather K/V): equal to full attention, forward and
backward, on 2, 3 and 4 ranks, causal and not, both layouts; bytes from the trace."""
import pytest


def _case(causal, layout, B=1, H=2, S=24, D=4):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from ddnb.context_parallel import split_sequence
    from ddnb.context_parallel.allgather import allgather_attention
    from ddnb.trace import Tracer

    n, r = dist.get_world_size(), dist.get_rank()
    g = torch.Generator().manual_seed(0)
    full = [torch.randn(B, H, S, D, generator=g, dtype=torch.float64) for _ in range(3)]
    q, k, v = (split_sequence(x, n, layout)[r].clone().requires_grad_() for x in full)
    tracer = Tracer()
    out = allgather_attention(q, k, v, causal=causal, layout=layout, tracer=tracer)
    out.square().sum().backward()
    qf, kf, vf = (x.clone().requires_grad_() for x in full)
    ref = F.scaled_dot_product_attention(qf, kf, vf, is_causal=causal)
    ref.square().sum().backward()
    mine = lambda t: split_sequence(t, n, layout)[r]  # noqa: E731
    err = max((out - mine(ref)).abs().max().item(), *[(a.grad - mine(b.grad)).abs().max().item()
                                                       for a, b in ((q, qf), (k, kf), (v, vf))])
    sent = sum(e["nbytes"] for e in tracer.take() if e["kind"] == "send")
    return err, sent


@pytest.mark.parametrize("n", [2, 3, 4])
def test_equals_full_attention_forward_and_backward(world, n):
    from ddnb.context_parallel.allgather import allgather_bytes_per_rank

    for causal in (False, True):
        for layout in ("contiguous", "zigzag"):
            res = world(n).run(_case, causal, layout)
            assert max(e for e, _ in res) < 1e-10, (causal, layout, res)
            want = allgather_bytes_per_rank(1, 2, 24, 4, n, element_size=8)
            assert all(s == want["forward"] + want["backward"] for _, s in res), (res, want)


def test_bad_input_is_named_before_any_message():
    import torch

    from ddnb.context_parallel.allgather import allgather_attention

    with pytest.raises(ValueError, match="layout"):
        allgather_attention(*(torch.zeros(1, 1, 4, 2) for _ in range(3)), layout="spiral")
