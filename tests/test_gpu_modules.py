"""The other parallelisms on CUDA (marker `gpu`), as tests/test_gpu.py does for the
all-reduces and data parallelism. Each test makes the check of its module's CPU test with
the tensors on `rank_device()` (this rank's GPU; the CPU with DDNB_GPU_TESTS_DEVICE=cpu),
over gloo (one GPU shared by the ranks is enough: gloo carries CUDA tensors through the
host) and over nccl with one GPU per rank where there are at least two (`needs_two`). The
outputs must be on the device the inputs were on and equal the reference.

- context parallelism (tests/test_ring_attention.py, test_allgather_attention.py,
  test_ulysses.py): ring attention (contiguous and zig-zag), all-gather attention and
  Ulysses, causal and not, forward and backward, against F.scaled_dot_product_attention
  on the whole sequence in one CPU process (float64); `agree`'s cross-rank check with
  device shards: a bad call on one rank raises on every rank before any data message;
- expert parallelism (test_moe.py, test_moe_load.py): ExpertParallelMoE's dispatch and
  combine (all-to-all) against the single-process MoE, forward and backward, dropped
  tokens included; the MoE load measurement on nccl (its layer on the rank's GPU);
- compression hooks (test_compression.py): fp16, bf16 and the plain all-reduce bit for
  bit and PowerSGD within 1e-5 of torch's hooks, on DDP and BucketedDataParallel, every
  hook handed buckets on the device; top-k and EF-SignSGD against the single-process
  reference; top-k at ratio 1 equal to the uncompressed mean;
- decentralized training (test_decentralized.py): one gossip step = W X; every method
  (D-PSGD in both orders on every topology, AD-PSGD, local SGD, EASGD, all-reduce SGD)
  equal to its single-process simulation, its bytes those of its formula; the
  decentralized parameter server on gloo only (its shard owners receive from any source,
  which nccl cannot);
- the data pipeline (test_data_pipeline.py): each rank's ShardedReader -> DecodedImages ->
  torch's DataLoader (pin_memory on a GPU: ddnb's pipeline has no pinning of its own) ->
  the device, every sample exactly once, equal to the same pipeline on the CPU;
- an emulated World asked for nccl (test_emulate.py, test_emulated_ddp.py): it warns and
  runs on gloo, and still trains device tensors (DDP, bucketed, naive data parallelism
  with ddnb's ring; D-PSGD's messages) bit for bit as real mode on the same devices, in emulated time.
"""
import math

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from ddnb.testing import World
from test_gpu import DEVICE, GPUS, needs_two, no_gpu, rank_device

pytestmark = [pytest.mark.gpu, no_gpu]
BACKENDS = ["gloo", pytest.param("nccl", marks=needs_two)]


def ranks(backend: str, gloo: int = 2) -> int:
    """Ranks of a test's World: `gloo` on gloo (sharing the GPUs there are), 4 on nccl
    where there are 4 GPUs, else 2 (sizes every layer below divides into)."""
    return gloo if backend == "gloo" else (4 if GPUS >= 4 else 2)


def on_devices(results, where=lambda r: r[0]) -> bool:
    """Every rank's reported device is DEVICE's kind (cuda:i, or cpu)."""
    return all(torch.device(where(r)).type == DEVICE for r in results)


def run_on(backend: str, fn, *args, gloo: int = 2, timeout: float = 120) -> list:
    """fn(*args) on every rank of a new World of `ranks(backend, gloo)` ranks on `backend`;
    the results in rank order, each starting with the device its rank reported."""
    with World(ranks(backend, gloo), timeout=timeout, backend=backend) as world:
        results = world.run(fn, *args)
    assert on_devices(results), [r[0] for r in results]
    return results


def error_and_events(fn, tracer) -> tuple:
    """(fn()'s ValueError message, or None when it returned; the events traced meanwhile)."""
    try:
        fn()
        message = None
    except ValueError as e:
        message = str(e)
    return message, tracer.take()


# ----------------------------------------------------------------------- context parallelism
B, H, D = 2, 4, 4      # H = 4: Ulysses gives 2 or 4 ranks whole heads
CP_CASES = [(scheme, causal, layout) for scheme in ("ring", "allgather", "ulysses") for causal in (False, True)
            for layout in ("contiguous", "zigzag") if scheme != "ulysses" or layout == "contiguous"]


def cp_inputs(n, seed=0):
    """q, k, v and the loss weights w of the whole sequence, (B, H, 4N, D) float64 each."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, 4 * n, D, generator=g, dtype=torch.float64) for _ in range(4)]


def attention_on_device():
    """On every rank, each case of CP_CASES on this rank's shard, on its device: (device,
    [(devices of out, dq, dk, dv), (out, dq, dk, dv) on the host] per case)."""
    from ddnb.context_parallel import allgather_attention, ring_attention, split_sequence, ulysses_attention

    r, n, dev = dist.get_rank(), dist.get_world_size(), rank_device()
    out = []
    for scheme, causal, layout in CP_CASES:
        q, k, v, w = (split_sequence(t, n, layout)[r].to(dev) for t in cp_inputs(n))   # (B, H, S/N, D)
        q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
        if scheme == "ring":
            y = ring_attention(q, k, v, causal=causal, layout=layout)
        elif scheme == "allgather":
            y = allgather_attention(q, k, v, causal=causal, layout=layout)
        else:
            y = ulysses_attention(q, k, v, causal=causal)
        (y * w).sum().backward()
        got = (y.detach(), q.grad, k.grad, v.grad)
        out.append(([str(t.device) for t in got], [t.cpu() for t in got]))
    return str(dev), out


@pytest.mark.parametrize("backend", BACKENDS)
def test_context_parallel_attention_on_the_device_equals_sdpa(backend):
    from ddnb.context_parallel import gather_sequence

    results = run_on(backend, attention_on_device)
    n = len(results)
    for i, (scheme, causal, layout) in enumerate(CP_CASES):
        q, k, v, w = (t.clone().requires_grad_(j < 3) for j, t in enumerate(cp_inputs(n)))
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        (ref * w).sum().backward()
        for j, expected in enumerate((ref.detach(), q.grad, k.grad, v.grad)):
            got = gather_sequence([res[1][i][1][j] for res in results], layout)
            err = (got - expected).abs().max().item()
            assert err < 1e-10, (scheme, causal, layout, ["out", "dq", "dk", "dv"][j], err)
        for dev, cases in results:
            assert cases[i][0] == [dev] * 4, (scheme, causal, layout, cases[i][0])   # out and grads stay there


def cp_bad_calls():
    """agree on device shards: one rank's shard shorter (ring), one rank's shards int64
    (Ulysses); each attempt's error and events; then a good call, still in step."""
    from ddnb.context_parallel import ring_attention, ulysses_attention
    from ddnb.trace import Tracer

    r, dev, tracer = dist.get_rank(), rank_device(), Tracer()
    x = torch.zeros(1, 4, 4, 3, dtype=torch.float64, device=dev)     # (B, H, S/N, D)
    short = x[:, :, :2] if r == 1 else x
    wrong = x.long() if r == 0 else x
    out = {"one rank's shard": error_and_events(lambda: ring_attention(short, short, short, tracer=tracer), tracer),
           "one rank int": error_and_events(lambda: ulysses_attention(wrong, wrong, wrong, tracer=tracer), tracer)}
    good = ring_attention(x + r, x + r, x + r)
    return str(dev), out, str(good.device)


@pytest.mark.parametrize("backend", BACKENDS)
def test_agree_raises_on_every_rank_before_any_data_with_device_shards(backend):
    results = run_on(backend, cp_bad_calls)
    n = len(results)
    for r, (dev, out, good_device) in enumerate(results):
        for name, (msg, events) in out.items():
            assert msg is not None, name
            assert all(e["name"] == "check" for e in events if e["kind"] in ("send", "recv")), name
        assert f"shard length: ranks {[i for i in range(n) if i != 1]}: 4; ranks [1]: 2" in out["one rank's shard"][0]
        assert "Ranks [0]: q, k and v must have one floating dtype" in out["one rank int"][0]
        assert good_device == dev


# ----------------------------------------------------------------------- expert parallelism
def moe_on_device():
    """On every rank, each case of test_moe.CASES with the layer and tokens on the device:
    (device, [(y, aux, dx, grads, last, devices of y, aux, dx and every grad)] per case)."""
    from ddnb.expert_parallel import ExpertParallelMoE, sync_router_grads
    from test_moe import CASES, make

    r, n, dev = dist.get_rank(), dist.get_world_size(), rank_device()
    out = []
    for top_k, cf, per in CASES:
        moe, x, w = make(n, top_k, cf, per)
        ep = ExpertParallelMoE.from_module(moe.to(dev))
        xl = x.chunk(n)[r].to(dev).clone().requires_grad_()           # (T/N, d)
        y, aux = ep(xl)
        ((y * w.chunk(n)[r].to(dev)).sum() + 0.1 * aux / n).backward()
        sync_router_grads(ep)
        grads = {name: p.grad for name, p in ep.named_parameters()}
        devices = {str(t.device) for t in (y, aux, xl.grad, *grads.values()) if t is not None}
        out.append((y.detach().cpu(), aux.item(), xl.grad.cpu(), {k: None if g is None else g.cpu()
                                                                  for k, g in grads.items()}, ep.last, devices))
    return str(dev), out


@pytest.mark.parametrize("backend", BACKENDS)
def test_expert_parallel_moe_on_the_device_equals_one_process(backend):
    from test_moe import CASES, make

    results = run_on(backend, moe_on_device)
    n = len(results)
    dropped_somewhere = False
    for i, (top_k, cf, per) in enumerate(CASES):
        moe, x, w = make(n, top_k, cf, per)
        x.requires_grad_()
        y, aux = moe(x, groups=n)
        ((y * w).sum() + 0.1 * aux).backward()
        dropped_somewhere |= sum(moe.last["dropped"]) > 0
        got = [res[1][i] for res in results]
        assert (torch.cat([g[0] for g in got]) - y).abs().max() < 1e-5, (n, top_k, cf)
        assert abs(sum(g[1] for g in got) / n - aux.item()) < 1e-5
        assert (torch.cat([g[2] for g in got]) - x.grad).abs().max() < 1e-5
        ref = dict(moe.named_parameters())
        for r, (_, _, _, grads, last, devices) in enumerate(got):
            assert devices == {results[r][0]}, (top_k, cf, r, devices)
            assert last["counts"] == moe.last["counts"][r] and last["dropped"] == moe.last["dropped"][r]
            for name, g in grads.items():
                assert g is not None, (top_k, cf, r, name)
                if name.startswith("experts."):                  # local expert j is global expert r·per + j
                    j, rest = name.split(".", 2)[1:]
                    name = f"experts.{r * per + int(j)}.{rest}"
                assert (g - ref[name].grad).abs().max() < 1e-5, (n, top_k, cf, r, name)
    assert dropped_somewhere, "the capacity cases must drop tokens"


@needs_two
def test_moe_load_on_nccl_routes_on_the_gpus():
    from ddnb.expert_parallel.load import moe_load

    n = ranks("nccl")
    with World(n, timeout=120, backend="nccl") as world:
        res = world.run(moe_load, 8, 2, 1.0, 0.0)
    received = sum(sum(r["received"]) for r in res)
    assert received + sum(r["dropped"] for r in res) == sum(r["assigned"] for r in res) == n * 2 * 64
    assert all(r["sent_bytes"] > 0 for r in res)


# ----------------------------------------------------------------------- compression hooks
def _noting(make, seen: set):
    """make(group, tracer) -> (state, hook), its hook noting the device of every bucket."""
    def made(group, tracer):
        state, hook = make(group, tracer)

        def noting(state, bucket):   # unannotated, with DDP's parameter names
            seen.add(str(bucket.buffer().device))
            return hook(state, bucket)
        return state, noting
    return made


def compression_on_device():
    """On every rank: test_compression's pairs (ours against torch's hooks) trained on the
    device; (device, devices of the buckets the hooks were handed, {case: result})."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    from ddnb.compression import make_hook
    from ddnb.compression.train import train_compressed
    from test_compression import CONFIGS, STEPS, _our_powersgd, _torch_powersgd

    dev, seen, out = rank_device(), set(), {}
    for method, theirs, wrapper in (("fp16", default_hooks.fp16_compress_hook, "ddp"),
                                    ("bf16", default_hooks.bf16_compress_hook, "bucketed"),
                                    ("none", default_hooks.allreduce_hook, "ddp")):
        a = train_compressed(wrapper=wrapper, steps=3, device=dev,
                             hook=_noting(lambda g, t, m=method: make_hook(m, group=g, tracer=t), seen))
        b = train_compressed(wrapper=wrapper, steps=3, device=dev, hook=_noting(lambda g, t, h=theirs: (g, h), seen))
        out[method] = (torch.equal(a["params"], b["params"]), a["bytes"], a["shapes"], a["device"])
    for wrapper, rank, kw in CONFIGS:
        theirs = train_compressed(wrapper=wrapper, steps=STEPS, device=dev, hook=_noting(_torch_powersgd(rank, **kw),
                                                                                         seen))
        ours = train_compressed(wrapper=wrapper, steps=STEPS, device=dev, hook=_noting(_our_powersgd(rank, **kw), seen))
        out[(wrapper, rank, tuple(sorted(kw)))] = ((ours["params"] - theirs["params"]).abs().max().item(),
                                                   ours["bytes"], ours["shapes"])
    return str(dev), seen, out


@pytest.mark.parametrize("backend", BACKENDS)
def test_compression_hooks_on_the_device_equal_torchs(backend):
    from ddnb.compression import method_bytes, powersgd_bytes
    from test_compression import CONFIGS, STEPS

    for dev, seen, out in run_on(backend, compression_on_device, timeout=300):
        assert seen == {dev}                         # ours and torch's hooks were handed buckets on the device
        for method in ("fp16", "bf16", "none"):
            same, nbytes, shapes, where = out[method]
            numel = sum(math.prod(s) for s in shapes)
            assert same and where == dev, method      # bit for bit
            assert set(nbytes.values()) == {(4 if method == "none" else 2) * numel} == {method_bytes(method, [shapes])}
        for wrapper, rank, kw in CONFIGS:
            err, nbytes, shapes = out[(wrapper, rank, tuple(sorted(kw)))]
            assert err < 1e-5, (wrapper, rank, kw, err)
            assert nbytes[0] == nbytes[1] == 4 * sum(math.prod(s) for s in shapes)   # start_powerSGD_iter=2
            assert all(nbytes[t] == powersgd_bytes(shapes, rank) for t in range(2, STEPS))


def hooks_on_device_buckets(method, steps, **kw):
    """test_compression._run_hook with the bucket on the device: (device, devices of the
    results and the error, averaged buffers and the last error on the host, bytes per step)."""
    from ddnb.compression import make_hook
    from ddnb.compression.comm import Bucket, bytes_per_step
    from ddnb.trace import Tracer
    from test_compression import SHAPES, _grads

    dev, tracer, devices, outs = rank_device(), Tracer(), set(), []
    state, hook = make_hook(method, tracer=tracer, **kw)
    for t in range(steps):
        buf = torch.cat([x.reshape(-1) for x in _grads(dist.get_rank(), t, SHAPES)]).to(dev)   # (126,)
        views, off = [], 0
        for s in SHAPES:
            views.append(buf[off:off + math.prod(s)].view(s))
            off += math.prod(s)
        got = hook(state, Bucket(0, buf, views)).wait()
        devices.add(str(got.device))
        outs.append(got.cpu())
    err = getattr(state, "error_dict", {}).get(0)
    if err is not None:
        devices.add(str(err.device))
    return str(dev), devices, outs, None if err is None else err.cpu(), bytes_per_step(tracer.take())


def ratio_one_on_device():
    _, mine, ours, err, _ = hooks_on_device_buckets("topk", 3, ratio=1.0)
    _, plain_devices, plain, _, _ = hooks_on_device_buckets("none", 3)
    return max((a - b).abs().max().item() for a, b in zip(ours, plain)), float(err.abs().max()), mine | plain_devices


@pytest.mark.parametrize("backend", BACKENDS)
def test_topk_and_sign_on_device_buckets_equal_the_reference(backend):
    from ddnb.compression import sign_bytes, topk_bytes
    from test_compression import _reference

    with World(ranks(backend), timeout=120, backend=backend) as world:
        n = world.n
        for method, kw in (("topk", {"ratio": 0.1}), ("sign", {})):
            got = world.run(hooks_on_device_buckets, method, 3, **kw)
            ref, errors = _reference(method, n, 3, k=13)
            expected = topk_bytes(13) if method == "topk" else sign_bytes([84, 12, 30])
            assert on_devices(got)
            for rank, (dev, devices, outs, err, nbytes) in enumerate(got):
                assert devices == {dev}, (method, devices)
                for t in range(3):
                    assert (outs[t] - ref[t]).abs().max() < 1e-5, (method, rank, t)
                assert (err - errors[rank]).abs().max() < 1e-5
                assert nbytes == {0: expected, 1: expected, 2: expected}
        for diff, err, devices in world.run(ratio_one_on_device):   # k = numel: nothing dropped, the plain mean
            assert err == 0.0 and len(devices) == 1 and diff <= (0.0 if n == 2 else 1e-6)   # 2 ranks: bit for bit


# ----------------------------------------------------------------------- decentralized training
def model_on_device():
    """test_decentralized's MLP, built on this rank's device (model_fn runs on the rank)."""
    from test_decentralized import MODEL

    return MODEL().to(rank_device())


def decentralized_on_device(method, config, with_test=False):
    """On every rank: TRAIN[method] with the model on the device; what the checks read."""
    from ddnb.decentralized import TRAIN
    from test_decentralized import TEST_SET, TRAIN_SET

    stats = TRAIN[method](config, model_on_device, TRAIN_SET, TEST_SET if with_test else None)
    return {"device": str(rank_device()), "params_device": str(stats["params"].device),
            "params": stats["params"].cpu(), "bytes_sent": stats["bytes_sent"],
            "bytes_received": stats["bytes_received"], "measured": stats["measured"], "updates": stats.get("updates")}


def gossip_on_device(name, numel):
    from ddnb.decentralized import gossip, topology

    x = (torch.arange(numel, dtype=torch.float32) * (dist.get_rank() + 1)).to(rank_device())   # (numel,)
    mixed = gossip(x, topology(name, dist.get_world_size()))
    return str(x.device), str(mixed.device), mixed.cpu()


@pytest.mark.parametrize("backend", BACKENDS)
def test_decentralized_methods_on_the_device_equal_their_simulations(backend):
    from ddnb.decentralized import TOPOLOGIES, DecentralizedConfig, run_bytes, simulate, topology
    from test_decentralized import CASES, MODEL, NUMEL, TRAIN_SET

    n = ranks(backend, gloo=4)
    with World(n, timeout=180, backend=backend) as world:
        for name in TOPOLOGIES:
            got = world.run(gossip_on_device, name, 5)
            X = torch.stack([torch.arange(5, dtype=torch.float64) * (r + 1) for r in range(n)])
            expected = topology(name, n).W @ X
            for r, (x_device, mixed_device, mixed) in enumerate(got):
                assert mixed_device == x_device and torch.device(x_device).type == DEVICE
                assert torch.allclose(mixed.double(), expected[r], atol=1e-6), (name, r)
        for method, sim, kw in CASES:
            config = DecentralizedConfig(steps=10, lr=0.1, measure_every=5, **kw)
            res = world.run(decentralized_on_device, method, config)
            assert all(r["params_device"] == r["device"] for r in res) and on_devices(res, lambda r: r["device"])
            err = (torch.stack([r["params"] for r in res]) - simulate(sim, config, MODEL, TRAIN_SET, n)).abs().max()
            assert err.item() < 1e-5, (method, kw, err)
            predicted = run_bytes(method, config, n, NUMEL)
            assert [r["bytes_sent"] for r in res] == [p["sent"] for p in predicted], (method, kw)
            assert [r["bytes_received"] for r in res] == [p["received"] for p in predicted], (method, kw)
        if backend == "gloo":     # the shard owners receive from any source: gloo only
            config = DecentralizedConfig(steps=60, lr=0.1, straggler_rank=3, straggler_delay=0.002)
            res = world.run(decentralized_on_device, "decentralized_ps", config, with_test=True)
            assert res[0]["measured"][-1]["accuracy"] > 0.8
            assert all(torch.equal(r["params"], res[0]["params"]) and r["params_device"] == r["device"] for r in res)
            assert [r["updates"] for r in res] == [n * 60] * n
            predicted = run_bytes("decentralized_ps", config, n, NUMEL)
            assert [r["bytes_sent"] for r in res] == [p["sent"] for p in predicted]


# ----------------------------------------------------------------------- the data pipeline
def pipeline_on_device(stored_by_format, seed):
    """On every rank, per format: its ShardedReader's samples through DecodedImages and a
    DataLoader (pinned on a GPU) to the device; (device, {format: (keys, x and y on the
    host, devices, whether every batch was pinned (None on the CPU), samples counted on
    the device by an all-reduce)})."""
    from torch.utils.data import DataLoader

    from ddnb.data_pipeline import DecodedImages, ShardedReader

    r, n, dev = dist.get_rank(), dist.get_world_size(), rank_device()
    pin, out = dev.type == "cuda", {}
    for fmt, stored in stored_by_format.items():
        samples = list(ShardedReader(stored, n, r, seed=seed))
        xs, ys, pinned = [], [], []
        for x, y in DataLoader(DecodedImages(samples, seed=1000 * r), batch_size=16, pin_memory=pin):
            if pin:
                pinned.append(x.is_pinned() and y.is_pinned())
            xs.append(x.to(dev, non_blocking=True))                    # (16, 3, H, W) float32
            ys.append(y.to(dev, non_blocking=True))                    # (16,) int64
        x, y = torch.cat(xs), torch.cat(ys)
        count = torch.tensor([len(y)], device=dev)
        dist.all_reduce(count)
        out[fmt] = ([s.key for s in samples], x.cpu(), y.cpu(), {str(x.device), str(y.device), str(count.device)},
                    all(pinned) if pin else None, int(count.item()))
    return str(dev), out


@pytest.mark.parametrize("backend", BACKENDS)
def test_sharded_reader_feeds_the_device_every_sample_once(backend, tmp_path):
    from ddnb.data_pipeline import FORMATS, DecodedImages, ShardedReader, make_images, write

    samples = make_images(100, size=16, seed=3)
    stored = {fmt: write(samples, str(tmp_path / fmt), fmt, 30) for fmt in FORMATS}   # shards 30, 30, 30, 10
    results = run_on(backend, pipeline_on_device, stored, 5, gloo=3)
    n = len(results)
    for fmt in FORMATS:
        keys = [k for _, out in results for k in out[fmt][0]]
        assert sorted(keys) == [s.key for s in samples], fmt                  # every sample, exactly once
        for r, (dev, out) in enumerate(results):
            got_keys, x, y, devices, pinned, count = out[fmt]
            assert devices == {dev} and count == len(samples)
            assert pinned is (True if DEVICE == "cuda" else None)
            mine = list(ShardedReader(stored[fmt], n, r, seed=5))            # the same pipeline, on the CPU
            ref = DecodedImages(mine, seed=1000 * r)
            assert got_keys == [s.key for s in mine]
            assert torch.equal(x, torch.stack([ref[i][0] for i in range(len(ref))]))
            assert y.tolist() == [ref[i][1] for i in range(len(ref))]


# ----------------------------------------------------------------------- one emulated run
DP_STRATEGIES = [("ddp", "torch"), ("bucketed", "torch"), ("naive", "ring")]   # bucketed's ring: not emulated


def steps_on_device(strategy, allreduce):
    """Two SGD steps of `strategy` with the model and batches on the device: (devices of the
    parameters, the parameters on the host, emulated seconds taken, or None in real mode)."""
    from ddnb.bench.dp import bench_model, wrap
    from ddnb.emulate import current

    dev, em = rank_device(), current()
    model, opt, sync = wrap(strategy, bench_model("many_small", seed=0, width=32, layers=2).to(dev),
                            allreduce=allreduce)
    g = torch.Generator().manual_seed(dist.get_rank())
    x = torch.randn(8, 32, generator=g).to(dev)                           # (B, width)
    y = torch.randn(8, 32, generator=g).to(dev)
    t0 = em.now() if em else None
    for _ in range(2):
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        sync()
        opt.step()
    params = [p.detach() for p in model.parameters()]
    if hasattr(model, "remove_hooks"):
        model.remove_hooks()
    return {str(p.device) for p in params}, [p.cpu() for p in params], (em.now() - t0) if em else None


def test_an_emulated_world_asked_for_nccl_runs_on_gloo_and_trains_device_tensors():
    from ddnb.decentralized import DecentralizedConfig, run_bytes, simulate
    from test_decentralized import MODEL, NUMEL, TRAIN_SET
    from test_emulated_ddp import ALPHA, FAST

    with World(2, timeout=120) as real:
        expected = [real.run(steps_on_device, *s) for s in DP_STRATEGIES]
    config = DecentralizedConfig(steps=4, lr=0.1, measure_every=2, topology="ring")
    with pytest.warns(UserWarning, match="emulated cluster runs on gloo") as warned:
        world = World(2, backend="nccl", emulate=FAST, timeout=120)
    with world:
        assert world.backend == "gloo"
        got = [world.run(steps_on_device, *s) for s in DP_STRATEGIES]
        dpsgd = world.run(decentralized_on_device, "dpsgd", config)
    said = [str(w.message) for w in warned if "emulated cluster" in str(w.message)]
    assert "CUDA tensors" in said[0] and "host memory" in said[0]         # it says what happens to them
    for s, emulated, real_ranks in zip(DP_STRATEGIES, got, expected):
        for (devices, params, seconds), (real_devices, real_params, _) in zip(emulated, real_ranks):
            assert devices == real_devices and len(devices) == 1 and torch.device(*devices).type == DEVICE, s
            assert all(torch.equal(p, q) for p, q in zip(params, real_params)), s   # the values are torch's
            assert seconds > 2 * ALPHA, s                                 # at least one message a step
    assert all(r["params_device"] == r["device"] for r in dpsgd) and on_devices(dpsgd, lambda r: r["device"])
    err = (torch.stack([r["params"] for r in dpsgd]) - simulate("dpsgd", config, MODEL, TRAIN_SET, 2)).abs().max()
    assert err.item() < 1e-5
    predicted = run_bytes("dpsgd", config, 2, NUMEL)
    assert [r["bytes_sent"] for r in dpsgd] == [p["sent"] for p in predicted] and predicted[0]["sent"] > 0
