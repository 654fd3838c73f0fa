"""ddnb.compression: each hook against torch's (fp16 and bf16 bit for bit, PowerSGD within
1e-5 given the same seed and rank, on DDP and on BucketedDataParallel), top-k and
EF-SignSGD against a single-process reference, error feedback at ratio 1 exact, bytes
per step from the trace equal to each method's formula, bad input named."""
import math

import pytest
import torch

from ddnb.compression import (METHODS, PowerSGDState, TopKState, make_hook, method_bytes, powersgd_bytes,
                              sign_bytes, topk_bytes)
from ddnb.compression.sign import pack_signs, unpack_signs
from ddnb.compression.topk import topk_compress
from ddnb.compression.train import train_compressed
from ddnb.runtime.errors import WorkerError

STEPS = 6


def _torch_powersgd(rank, **kw):
    def make(group, tracer):
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as P
        return P.PowerSGDState(group, matrix_approximation_rank=rank, start_powerSGD_iter=2, **kw), P.powerSGD_hook
    return make


def _our_powersgd(rank, **kw):
    def make(group, tracer):
        from ddnb.compression import PowerSGDState, powersgd_hook
        return PowerSGDState(group, matrix_approximation_rank=rank, start_powerSGD_iter=2, tracer=tracer,
                             **kw), powersgd_hook
    return make


def _powersgd_pairs(configs):
    out = []
    for wrapper, rank, kw in configs:
        theirs = train_compressed(wrapper=wrapper, steps=STEPS, hook=_torch_powersgd(rank, **kw))
        ours = train_compressed(wrapper=wrapper, steps=STEPS, hook=_our_powersgd(rank, **kw))
        out.append(((ours["params"] - theirs["params"]).abs().max().item(), ours["bytes"], ours["shapes"]))
    return out


CONFIGS = [("ddp", 1, {}), ("ddp", 2, {}), ("ddp", 4, {}), ("bucketed", 4, {}),
           ("ddp", 2, {"batch_tensors_with_same_shape": True}), ("ddp", 2, {"warm_start": False}),
           ("ddp", 3, {"use_error_feedback": False, "orthogonalization_epsilon": 1e-8, "random_seed": 7})]


def test_powersgd_equals_torch_and_its_bytes_formula(world):
    got = world(2).run(_powersgd_pairs, CONFIGS)[0]
    for (wrapper, rank, kw), (err, nbytes, shapes) in zip(CONFIGS, got):
        assert err < 1e-5, (wrapper, rank, kw, err)
        numel = sum(math.prod(s) for s in shapes)
        assert nbytes[0] == nbytes[1] == 4 * numel                       # start_powerSGD_iter=2: plain
        assert all(nbytes[t] == powersgd_bytes(shapes, rank) for t in range(2, STEPS))
    shapes = got[0][2]                       # (256, 64), (256,), (256, 256), (256,), (10, 256), (10,)
    assert powersgd_bytes(shapes, 4) == 4 * ((256 + 64) * 4 + (256 + 256) * 4 + (10 + 256) * 4 + 256 + 256 + 10)
    assert 4 * sum(math.prod(s) for s in shapes) / powersgd_bytes(shapes, 4) >= 10   # the bench's target, by formula


def _half_pairs():
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as D

    out = {}
    for method, theirs, wrapper in (("fp16", D.fp16_compress_hook, "ddp"), ("bf16", D.bf16_compress_hook, "bucketed"),
                                    ("none", D.allreduce_hook, "ddp")):
        a = train_compressed(method, wrapper=wrapper, steps=3)
        b = train_compressed(wrapper=wrapper, steps=3, hook=lambda g, t, h=theirs: (g, h))
        out[method] = (torch.equal(a["params"], b["params"]), a["bytes"], a["shapes"])
    plain = train_compressed(None, steps=3)                              # DDP's own all-reduce
    out["ddp"] = torch.equal(plain["params"], train_compressed("none", steps=3)["params"])
    return out


def test_half_precision_hooks_equal_torch_bit_for_bit(world):
    got = world(2).run(_half_pairs)[0]
    assert got["ddp"]                                                    # allreduce_hook == no hook at all
    for method in ("fp16", "bf16", "none"):
        same, nbytes, shapes = got[method]
        assert same, method
        numel = sum(math.prod(s) for s in shapes)
        assert set(nbytes.values()) == {(4 if method == "none" else 2) * numel}
        assert nbytes[0] == method_bytes(method, [shapes])


# ------------------------------------------------------------------ top-k and sign on a Bucket
def _grads(rank, step, shapes):
    g = torch.Generator().manual_seed(100 * step + rank)
    return [torch.randn(s, generator=g) for s in shapes]


def _run_hook(method, shapes, steps, **kw):
    """Each step: rank r's gradients from _grads, through the hook on one Bucket; returns
    the averaged buffers, the error after the last step, and the bytes per step."""
    import torch.distributed as dist

    from ddnb.compression.comm import Bucket, bytes_per_step
    from ddnb.trace import Tracer

    tracer = Tracer()
    state, hook = make_hook(method, tracer=tracer, **kw)
    out = []
    for t in range(steps):
        buf = torch.cat([x.reshape(-1) for x in _grads(dist.get_rank(), t, shapes)])
        views, off = [], 0
        for s in shapes:
            views.append(buf[off:off + math.prod(s)].view(s))
            off += math.prod(s)
        out.append(hook(state, Bucket(0, buf, views)).wait().clone())
    err = getattr(state, "error_dict", {}).get(0)
    return out, err, bytes_per_step(tracer.take())


SHAPES = [(12, 7), (12,), (5, 3, 2)]          # 84 + 12 + 30 = 126 elements


def _reference(method, n, steps, k=None):
    """One process doing what `method`'s hook does on n ranks (with error feedback)."""
    errors = [torch.zeros(126) for _ in range(n)]
    sizes = [math.prod(s) for s in SHAPES]
    out = []
    for t in range(steps):
        sent = []
        for r in range(n):
            a = torch.cat([x.reshape(-1) for x in _grads(r, t, SHAPES)]) + errors[r]
            if method == "topk":
                keep = torch.zeros(126)
                top = a.abs().argsort(descending=True)[:k]
                keep[top] = a[top]
            else:   # signSGD with a scale (Bernstein et al. 2018; Karimireddy et al. 2019, Alg. 1): (|p|_1 / d) sign(p)
                keep = torch.cat([(p.abs().mean()) * torch.where(p < 0, -1.0, 1.0) for p in a.split(sizes)])
            errors[r] = a - keep
            sent.append(keep)
        out.append(sum(sent) / n)
    return out, errors


@pytest.mark.parametrize("method, kw", [("topk", {"ratio": 0.1}), ("sign", {})])
def test_topk_and_sign_equal_the_reference_and_their_bytes(world, method, kw):
    got = world(4).run(_run_hook, method, SHAPES, 3, **kw)
    ref, errors = _reference(method, 4, 3, k=13)
    for rank, (out, err, nbytes) in enumerate(got):
        for t in range(3):
            assert (out[t] - ref[t]).abs().max() < 1e-6
        assert (err - errors[rank]).abs().max() < 1e-6
        expected = topk_bytes(13) if method == "topk" else sign_bytes([84, 12, 30])
        assert nbytes == {0: expected, 1: expected, 2: expected}
        assert expected == method_bytes(method, [SHAPES], ratio=0.1)
    assert sign_bytes([84, 12, 30]) == 16 + 12 and topk_bytes(13) == 104


def _ratio_one(method, **kw):
    ours, err, _ = _run_hook(method, SHAPES, 3, **kw)
    plain, _, _ = _run_hook("none", SHAPES, 3)
    return [torch.equal(a, b) for a, b in zip(ours, plain)], float(err.abs().max())


def test_error_feedback_at_ratio_one_equals_uncompressed_exactly(world):
    for same, err in world(2).run(_ratio_one, "topk", ratio=1.0):
        assert same == [True, True, True] and err == 0.0                # k = numel: nothing dropped


def test_sign_bits_round_trip_and_error_feedback_telescopes():
    x = torch.tensor([0.5, -1.0, 0.0, -0.0, 3.0, -2.0, 1.0, -1.0, 7.0])
    packed = pack_signs(x)
    assert packed.tolist() == [0b10111010, 0b10000000] and packed.dtype == torch.uint8
    assert unpack_signs(packed, 9).tolist() == [1, -1, 1, 1, 1, -1, 1, -1, 1]
    ref, errors = _reference("sign", 1, 5)                               # one rank: Σ sent + e = Σ g
    total = sum(torch.cat([x.reshape(-1) for x in _grads(0, t, SHAPES)]) for t in range(5))
    assert (sum(ref) + errors[0] - total).abs().max() < 1e-5
    idx, val = topk_compress(torch.tensor([1.0, -5.0, 2.0, 4.0]), 2)
    assert sorted(idx.tolist()) == [1, 3] and sorted(val.tolist()) == [-5.0, 4.0] and idx.dtype == torch.int32


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("call, message", [
    (lambda: make_hook("gzip"), "method='gzip' is not one of ('none', 'fp16', 'bf16', 'powersgd', 'topk', 'sign')"),
    (lambda: TopKState(k=0), "k=0: need an integer >= 1"),
    (lambda: TopKState(k=-3), "k=-3: need an integer >= 1"),
    (lambda: TopKState(ratio=0.0), "ratio=0.0: need a number > 0 and <= 1"),
    (lambda: TopKState(ratio=0.1, k=3), "give one of ratio=0.1 and k=3"),
    (lambda: make_hook("topk", ratio=1.5), "ratio=1.5: need a number > 0 and <= 1"),
    (lambda: PowerSGDState(matrix_approximation_rank=0), "matrix_approximation_rank=0: need an integer >= 1"),
    (lambda: PowerSGDState(start_powerSGD_iter=1), "start_powerSGD_iter=1: need > 1 with error feedback"),
    (lambda: powersgd_bytes([(10, 128), (128,)], 10), "rank=10 >= the smaller side 10 of tensor 0 (10, 128)"),
    (lambda: powersgd_bytes([(3, 4, 5)], 0), "rank=0: need an integer >= 1"),
    (lambda: method_bytes("zip", [[(4,)]]), "method='zip' is not one of"),
    (lambda: topk_compress(torch.ones(4), 0), "k=0: need an integer >= 1 and <= 4"),
])
def test_bad_input_is_named(call, message):
    with pytest.raises(ValueError) as e:
        call()
    assert message in str(e.value)


def test_rank_too_large_raises_on_every_rank_before_sending(world):
    w = world(2)
    with pytest.raises(WorkerError) as e:                                # (10, 256): smaller side 10
        w.run(train_compressed, "powersgd", steps=3, rank=10)
    assert "ranks [0, 1] raised" in str(e.value) and "rank=10 >= the smaller side 10" in str(e.value)
    assert not w.broken and w.run(lambda: 1) == [1, 1]                   # nobody hangs


def _register_twice():
    from ddnb.data_parallel import BucketedDataParallel
    from ddnb.models import mlp

    model = BucketedDataParallel(mlp(seed=0))
    model.register_comm_hook(*make_hook("fp16"))
    try:
        model.register_comm_hook(None, "not a hook")
    except ValueError as e:
        return str(e)
    finally:
        model.remove_hooks()


def test_bucketed_register_comm_hook_names_bad_input(world):
    msg = world(2).run(_register_twice)[0]
    assert "hook='not a hook' is not callable" in msg and "already registered" in msg


def test_methods_listed():
    assert METHODS == ("none", "fp16", "bf16", "powersgd", "topk", "sign")
