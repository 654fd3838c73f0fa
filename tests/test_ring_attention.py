"""ddnb.context_parallel.ring_attention: output and gradients equal to
F.scaled_dot_product_attention on the unsharded sequence (float64, within 1e-5), causal
and not, contiguous and zig-zag shards, on 2, 3 and 4 ranks; the bytes each rank sends
(from the trace) against ring_bytes_per_rank; the work each rank computes (traced blocks)
against ring_work, balanced by zig-zag; bad input raising before any data message, on
every rank. Groups of 2 and 3 ranks are subgroups of the session's world(4)."""
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from ddnb.context_parallel import gather_sequence, ring_attention, ring_bytes_per_rank, ring_work, split_sequence
from ddnb.trace import Tracer
from subgroups import WORLD, group_of_size, groups, run_all

B, H, D = 2, 3, 4


def full_inputs(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    s = 4 * n
    return [torch.randn(B, H, s, D, generator=g, dtype=torch.float64) for _ in range(4)]   # q, k, v, w


def sharded_run():
    """Per group and case: (n, causal, layout, rank, out shard, dq, dk, dv, events)."""
    results = []
    for group, n in groups():
        r = dist.get_rank(group)
        for causal in (False, True):
            for layout in ("contiguous", "zigzag"):
                q, k, v, w = (split_sequence(t, n, layout)[r] for t in full_inputs(n))
                q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
                tracer = Tracer(rank=r)
                out = ring_attention(q, k, v, group=group, causal=causal, layout=layout, tracer=tracer)
                (out * w).sum().backward()
                results.append((n, causal, layout, r, out.detach(), q.grad, k.grad, v.grad, tracer.take()))
    return results


@pytest.fixture(scope="module")
def runs(world):
    return run_all(world, sharded_run)


def test_equal_to_sdpa_on_the_whole_sequence_forward_and_backward(runs):
    cases = {}
    for n, causal, layout, r, out, dq, dk, dv, _ in runs:
        cases.setdefault((n, causal, layout), {})[r] = (out, dq, dk, dv)
    assert set(cases) == {(n, c, lay) for n in (2, 3, 4) for c in (False, True) for lay in ("contiguous", "zigzag")}
    worst = 0.0
    for (n, causal, layout), by_rank in cases.items():
        q, k, v, w = (t.clone().requires_grad_(i < 3) for i, t in enumerate(full_inputs(n)))
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        (ref * w).sum().backward()
        for i, expected in enumerate((ref.detach(), q.grad, k.grad, v.grad)):
            got = gather_sequence([by_rank[r][i] for r in range(n)], layout)
            err = (got - expected).abs().max().item()
            worst = max(worst, err)
            assert err < 1e-5, (n, causal, layout, ["out", "dq", "dk", "dv"][i], err)
    assert worst < 1e-12     # float64: the merge is exact up to rounding


def test_bytes_per_rank_match_the_formula(runs):
    for n, causal, layout, r, out, *_, events in runs:
        sent = [e for e in events if e["kind"] == "send" and e["name"] != "check"]
        assert sum(e["nbytes"] for e in sent) == ring_bytes_per_rank(B, H, 4 * n, D, n, element_size=8)
        assert {e["peer"] for e in sent} == {(r + 1) % n}                 # only the ring's next rank
        assert sum(e["name"] == "ring dkv" for e in sent) == n and sum(e["name"] == "ring kv" for e in sent) \
            == 2 * (n - 1)


def test_work_per_rank_is_balanced_by_zigzag(runs):
    work = {}
    for n, causal, layout, r, *_, events in runs:
        fwd = [e for e in events if e["name"] == "attention block" and e["phase"] == "forward"]
        work.setdefault((n, causal, layout), [0] * n)[r] = sum(e["q_rows"] * e["k_rows"] for e in fwd)
    for (n, causal, layout), measured in work.items():
        assert measured == ring_work(n, 4 * n, causal, layout)
    s = 16                                                               # S = 4N, N = 4: S/N = 4
    assert work[(4, True, "contiguous")] == [(r + 1) * 4 ** 2 for r in range(4)] == [16, 32, 48, 64]
    assert work[(4, True, "zigzag")] == [(2 * 4 + 1) * (s // 8) ** 2] * 4 == [36] * 4
    assert work[(4, False, "zigzag")] == [4 * 4 ** 2] * 4


def test_split_sequence_names_the_sizes():
    with pytest.raises(ValueError, match=r"sequence length 10 is not divisible by N=4 \(world_size=4"):
        split_sequence(torch.zeros(1, 1, 10, 2), 4)
    with pytest.raises(ValueError, match=r"sequence length 12 is not divisible by 2N=8 .*zigzag"):
        split_sequence(torch.zeros(1, 1, 12, 2), 4, "zigzag")
    with pytest.raises(ValueError, match=r"ring_work: sequence length 10 is not divisible by 2N=8"):
        ring_work(4, 10, True, "zigzag")
    with pytest.raises(ValueError, match=r"layout='ring' is not one of"):
        ring_work(4, 16, True, "ring")
    x = torch.randn(2, 3, 24, 5)
    for layout in ("contiguous", "zigzag"):
        assert torch.equal(gather_sequence(split_sequence(x, 3, layout), layout), x)


def bad_calls():
    """On the 3 ranks of [0, 2, 3]: calls bad on every rank, then on one rank only; each
    attempt's error and the messages sent; then a good call (still in step)."""
    group = group_of_size(3)
    if group == "none":
        return None
    r, tracer = dist.get_rank(group), Tracer()
    x = torch.zeros(1, 2, 4, 3, dtype=torch.float64)

    def attempt(fn):
        try:
            fn()
            return None, tracer.take()
        except ValueError as e:
            return str(e), tracer.take()

    out = {
        "3-D": attempt(lambda: ring_attention(x[0], x[0], x[0], group=group, tracer=tracer)),
        "odd zigzag": attempt(lambda: ring_attention(x[:, :, :3], x[:, :, :3], x[:, :, :3], group=group,
                                                     causal=True, layout="zigzag", tracer=tracer)),
        "one rank's shard": attempt(lambda: ring_attention(*(x[:, :, :2 if r == 1 else 4],) * 3, group=group,
                                                           tracer=tracer)),
        "one rank int": attempt(lambda: ring_attention(*((x.long() if r == 2 else x),) * 3, group=group,
                                                       tracer=tracer)),
        "unchecked": attempt(lambda: ring_attention(x, x, x[..., :2], group=group, tracer=tracer, check=False)),
    }
    good = ring_attention(x + r, x + r, x + r, group=group)
    return r, out, good.shape


def test_bad_input_raises_on_every_rank_before_any_data(world):
    results = [res for res in world(WORLD).run(bad_calls) if res is not None]
    assert [res[0] for res in results] == [0, 1, 2]
    for r, out, shape in results:
        for name, (msg, events) in out.items():
            assert msg is not None, name
            assert all(e["name"] == "check" for e in events if e["kind"] in ("send", "recv")), name
        assert "q must be a 4-D tensor (batch, heads, seq/N, head_dim), got (2, 4, 3)" in out["3-D"][0]
        assert f"ring_attention on rank {r}: bad arguments. Ranks [0, 1, 2]:" in out["3-D"][0]
        assert "its length 3 must be even" in out["odd zigzag"][0]
        assert "shard length: ranks [0, 2]: 4; ranks [1]: 2" in out["one rank's shard"][0]
        assert "Ranks [2]: q, k and v must have one floating dtype" in out["one rank int"][0]
        assert out["unchecked"][1] == [] and "q, k and v must have one shape" in out["unchecked"][0]
        assert shape == (1, 2, 4, 3)


def torch_context_parallel():
    """What torch 2.13's experimental context_parallel does on CPU / gloo, in a few words."""
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.experimental import context_parallel

        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        q, k, v = (torch.randn(1, 2, 8, 4) for _ in range(3))
        with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return "ran"
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"


def test_torch_context_parallel_on_cpu(world):
    """What ring_attention's docstring says: torch 2.13's context_parallel does not run on
    CPU / gloo (if this fails, torch gained it: compare with it and update the docstring)."""
    got = world(2).run(torch_context_parallel)
    assert got == ["NotImplementedError: Operator aten._scaled_dot_product_flash_attention_for_cpu.default "
                   "does not have a sharding strategy registered."] * 2, got
