"""ddnb.context_parallel.ulysses_attention: output and gradients equal to
F.scaled_dot_product_attention on the unsharded sequence (float64, within 1e-5), causal
and not, on 2, 3 and 4 ranks; the two all-to-alls are each other's inverse; the bytes
each rank sends (trace) against ulysses_bytes_per_rank; heads < N and the rest of the
bad input named on every rank before any data message."""
import torch
import torch.distributed as dist
import torch.nn.functional as F

from ddnb.context_parallel import (gather_sequence, heads_to_seq, seq_to_heads, split_sequence, ulysses_attention,
                                   ulysses_bytes_per_rank)
from ddnb.trace import Tracer
from subgroups import WORLD, group_of_size, groups, run_all

B, H, D = 2, 12, 3


def full_inputs(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, 3 * n, D, generator=g, dtype=torch.float64) for _ in range(4)]   # q, k, v, w


def sharded_run():
    out = []
    for group, n in groups():
        r = dist.get_rank(group)
        for causal in (False, True):
            q, k, v, w = (split_sequence(t, n)[r] for t in full_inputs(n))
            q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
            tracer = Tracer(rank=r)
            y = ulysses_attention(q, k, v, group, causal=causal, tracer=tracer)
            (y * w).sum().backward()
            heads = seq_to_heads(q.detach()[None], group)[0]               # (B, H/N, S, D)
            back = heads_to_seq(heads, group)
            out.append((n, causal, r, y.detach(), q.grad, k.grad, v.grad, tracer.take(), heads, back, q.detach()))
    return out


def test_equal_to_sdpa_and_bytes_from_the_trace(world):
    runs = run_all(world, sharded_run)
    cases = {}
    for n, causal, r, *rest in runs:
        cases.setdefault((n, causal), {})[r] = rest
    assert set(cases) == {(n, c) for n in (2, 3, 4) for c in (False, True)}
    for (n, causal), ranks in cases.items():
        q, k, v, w = (t.clone().requires_grad_(i < 3) for i, t in enumerate(full_inputs(n)))
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        (ref * w).sum().backward()
        for i, expected in enumerate((ref.detach(), q.grad, k.grad, v.grad)):
            got = gather_sequence([ranks[r][i] for r in range(n)])
            assert (got - expected).abs().max() < 1e-5, (n, causal, i)
        for r in range(n):
            events, heads, back, mine = ranks[r][4:]
            assert torch.equal(heads, q.detach()[:, r * H // n:(r + 1) * H // n])   # my heads, every position
            assert torch.equal(back, mine)                                           # and back again
            sent = [e for e in events if e["kind"] == "send" and e["name"] == "all_to_all"]
            assert sum(e["nbytes"] for e in sent) == ulysses_bytes_per_rank(B, H, 3 * n, D, n, element_size=8)
            assert len(sent) == 4 * (n - 1)                                          # 4 all-to-alls of N-1 rounds


def bad_calls():
    group = group_of_size(3)
    if group == "none":
        return None
    r, tracer = dist.get_rank(group), Tracer()
    x = torch.zeros(1, 6, 4, 2)
    out = {}
    for name, args in {"heads < N": (x[:, :2],) * 3, "heads % N": (x[:, :4],) * 3,
                       "one rank's shard": (x[:, :, :3 if r == 2 else 4],) * 3}.items():
        try:
            ulysses_attention(*args, group=group, tracer=tracer)
        except ValueError as e:
            out[name] = str(e)
    events = tracer.take()
    return r, out, events, tuple(ulysses_attention(x, x, x, group).shape)


def test_bad_input_raises_on_every_rank_before_any_data(world):
    results = [res for res in world(WORLD).run(bad_calls) if res is not None]
    assert len(results) == 3
    for r, out, events, shape in results:
        assert f"ulysses_attention on rank {r}: bad arguments. Ranks [0, 1, 2]: heads=2 < N=3: Ulysses gives " \
               f"each rank whole heads" in out["heads < N"]
        assert "heads=4 is not divisible by N=3" in out["heads % N"]
        assert "shard length: ranks [0, 1]: 4; ranks [2]: 3" in out["one rank's shard"]
        assert all(e["name"] == "check" for e in events if e["kind"] in ("send", "recv"))
        assert shape == (1, 6, 4, 2)
