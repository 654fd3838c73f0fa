"""check_ring_attention (notebook 13) accepts the solution's ring loop and rejects the typical
wrong loops with their hints, naming a rank; the library's ring attention and all-gathers
of k/v are refused."""
import functools

import pytest

from ddnb.exercises import check_ring_attention
from ddnb.exercises.solutions.ring_attention import ring_attention_mine


def ring(q, k, v, causal, direction=1, diagonal="tril", skip_future=True, merged=True, resend_own=False,
         lse_of="merged", scale_q_in_place=False, steps_less=0):
    """The solution's loop with one knob per typical mistake (defaults: correct)."""
    import torch
    import torch.distributed as dist

    from ddnb.context_parallel import attend_block, merge

    rank, n = dist.get_rank(), dist.get_world_size()
    scale = q.shape[-1] ** -0.5
    if scale_q_in_place:
        q.mul_(scale)
        scale = 1.0
    out, lse = torch.zeros_like(q), torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype)
    own = kv = torch.stack([k, v])
    last_l = None
    for step in range(n - steps_less):
        src = (rank - step) % n
        if not causal or src <= rank or not skip_future:
            masked = causal and src == rank
            if masked and diagonal == "strict":
                s = q @ kv[0].transpose(-2, -1) * scale
                s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(-1), float("-inf"))
                last_l = torch.logsumexp(s, -1)
                o = torch.softmax(s, -1) @ kv[1]
            else:
                o, last_l = attend_block(q, kv[0], kv[1], scale, masked and diagonal != "none")
            out, lse = merge(out, lse, o, last_l) if merged else (out + o, torch.logaddexp(lse, last_l))
        if step < n - 1:
            nxt = torch.empty_like(kv)
            pending = [dist.isend(own if resend_own else kv, (rank + direction) % n),
                       dist.irecv(nxt, (rank - direction) % n)]
            for p in pending:
                p.wait()
            kv = nxt
    return out, (last_l if lse_of == "last" else lse)


def library_ring(q, k, v, causal):
    from ddnb.context_parallel import ring_attention

    return ring_attention(q, k, v, causal=causal), None


def library_ring_by_another_name(q, k, v, causal):
    import importlib

    fn = getattr(importlib.import_module("ddnb.context_parallel"), "ring_" + "attention")
    return fn(q, k, v, causal=causal), None


def gathers(q, k, v, causal):
    import torch
    import torch.distributed as dist

    parts = [torch.empty_like(k) for _ in range(dist.get_world_size())]
    getattr(dist, "all_" + "gather")(parts, k)          # a name the static check cannot see: refused on the rank
    return q, q[..., 0]


def gathers_by_name(q, k, v, causal):
    import torch.distributed as dist

    dist.all_gather([], k)
    return q, q[..., 0]


def out_only(q, k, v, causal):
    return ring_attention_mine(q, k, v, causal)[0]


def stub(q, k, v, causal):
    raise NotImplementedError("Exercise 13.3: write stub")


def test_solution_passes_and_fast():
    import time

    check_ring_attention(ring_attention_mine)            # starts the worlds of 3 and 4 ranks
    t = time.perf_counter()
    assert check_ring_attention(ring_attention_mine).startswith("✓ check_ring_attention: output, lse and dq")
    assert time.perf_counter() - t < 5
    assert check_ring_attention(functools.partial(ring), world_sizes=(2,)).startswith("✓")


@pytest.mark.parametrize("knobs, hint", [
    (dict(diagonal="none"), r"output \(causal ring on 3 processes\) on rank \d.*diagonal block .* causal mask"),
    (dict(skip_future=False), r"output \(causal ring on 3 processes\) on rank \d.*all future .* skip its compute"),
    (dict(direction=-1), r"output \(causal ring on 3 processes\) on rank \d.*passed the other way"),
    (dict(resend_own=True), r"output \(non-causal ring on 3 processes\) on rank \d.*attended twice"),
    (dict(steps_less=1), r"output \(non-causal ring on 3 processes\) on rank \d.*last block was never attended"),
    (dict(merged=False), r"output \(non-causal ring on 3 processes\) on rank \d.*without their weights"),
    (dict(diagonal="strict"), r"output \(causal ring on 3 processes\) on rank \d.*a NaN.*tril\(-1\)"),
    (dict(lse_of="last"), r"lse \(non-causal ring on 3 processes\) on rank \d.*one block's lse"),
    (dict(scale_q_in_place=True), r"changed q in place on rank 0 .*leave q, k, v as they are"),
])
def test_typical_mistakes_fail_with_their_hint(knobs, hint):
    with pytest.raises(AssertionError, match=hint):
        check_ring_attention(functools.partial(ring, **knobs))


@pytest.mark.parametrize("fn, hint", [
    (library_ring, r"library_ring calls ring_attention, the library's ring attention: the exercise is the ring"),
    (gathers_by_name, r"gathers_by_name calls all_gather, an all-gather of k/v"),
    (library_ring_by_another_name, r"raised on rank \d: AssertionError: your function used the library's ring"),
    (gathers, r"raised on rank \d: AssertionError: your function used an all-gather of k/v"),
])
def test_shortcuts_are_refused(fn, hint):
    with pytest.raises(AssertionError, match=hint):
        check_ring_attention(fn)


def test_the_ranks_work_again_after_a_refusal():
    with pytest.raises(AssertionError):
        check_ring_attention(gathers)
    assert check_ring_attention(ring_attention_mine).startswith("✓")   # dist.all_gather restored, worlds alive


def test_malformed_return_and_stub_and_arguments():
    with pytest.raises(AssertionError, match=r"out_only on rank 0 returned Tensor: return \(out, lse\)"):
        check_ring_attention(out_only)
    assert check_ring_attention(stub, exercise="13.3").startswith("Exercise 13.3 not attempted yet")
    with pytest.raises(ValueError, match=r"world_sizes\[0\]"):
        check_ring_attention(ring_attention_mine, world_sizes=(1,))
