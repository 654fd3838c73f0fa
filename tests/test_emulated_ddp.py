"""Emulated DDP and bucketed data parallelism (#28, item 2): the parameters are real mode's,
bit for bit, and the step's time comes from the messages of the ring each bucket's
all-reduce runs over the emulated links: more messages, a slower step, by their latencies."""
import pytest
import torch

from ddnb.emulate import custom
from ddnb.testing import World

ALPHA = 1e-3     # 1 ms a message: a message count shows in the step time
FAST = custom(alpha=ALPHA, bandwidth=1e9, peak_flops=1e12, efficiency=1.0, memory_bandwidth=1e12, slowdown=5)
STEPS = 2


def _train(strategy: str, segment_bytes: int | None = None):
    """STEPS steps of `strategy` on a 2-layer MLP (one bucket); returns (parameters,
    (emulated start, end) or None, this rank's messages per step or None)."""
    import torch.distributed as dist
    import torch.nn.functional as F

    from ddnb.bench.dp import bench_model, wrap
    from ddnb.emulate import current, messages

    em = current()
    saved = messages.SEGMENT_BYTES
    if segment_bytes is not None:
        messages.SEGMENT_BYTES = segment_bytes
    try:
        model, opt, sync = wrap(strategy, bench_model("many_small", seed=0, width=32, layers=2))
        g = torch.Generator().manual_seed(dist.get_rank())
        x, y = torch.randn(8, 32, generator=g), torch.randn(8, 32, generator=g)   # (B, width)
        t0 = messages.barrier() if em else None
        m0 = em.messages if em else None
        for _ in range(STEPS):
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            sync()
            opt.step()
        times = (t0, em.now()) if em else None
        sent = (em.messages - m0) / STEPS if em else None
        if hasattr(model, "remove_hooks"):
            model.remove_hooks()
        return [p.detach().clone() for p in model.parameters()], times, sent
    finally:
        messages.SEGMENT_BYTES = saved


def step_time(ranks) -> float:
    """Emulated seconds a step, from the last rank's start to the last rank's end."""
    return (max(t[1] for _, t, _ in ranks) - max(t[0] for _, t, _ in ranks)) / STEPS


@pytest.fixture(scope="module")
def real_params():
    with World(3, timeout=120) as w:
        return {s: w.run(_train, s)[0][0] for s in ("ddp", "bucketed")}


@pytest.mark.parametrize("strategy", ["ddp", "bucketed"])
def test_emulated_data_parallel_is_real_mode_bit_for_bit_and_timed_by_its_messages(strategy, real_params):
    with World(3, emulate=FAST, timeout=120) as w:
        one, seg = w.run(_train, strategy), w.run(_train, strategy, 256)      # 256-byte segments
        assert not any(r["overruns"] for r in w.emulation_reports())
    (params, _, m_one), (params_seg, _, m_seg) = one[0], seg[0]
    t_one, t_seg = step_time(one), step_time(seg)
    for p, q, r in zip(params, params_seg, real_params[strategy]):
        assert torch.equal(p, r) and torch.equal(q, r)        # bit for bit: the values are torch's
    # The bucket (2 x (32x32 + 32) floats = 8,448 B) is cut into 3 chunks of 2,816 B: one
    # message per chunk and ring step is 2(N-1) = 4 a step; 256-byte segments make 11 of each.
    assert m_one == 4 and m_seg == 44
    # Each message holds the rank's link for alpha + n/B: 40 more of them on the ring's
    # critical path add 40 alphas to the step (the bytes, 8 KB at 1 GB/s, are the same).
    assert t_seg - t_one == pytest.approx((m_seg - m_one) * ALPHA, rel=0.01)
