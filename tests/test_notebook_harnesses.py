"""The harnesses notebooks 05, 09, 10, 12 and 14 call, on a live 4-rank world, each
asserting what the notebook prints: a tree all-reduce written as in notebook 05 equals
ddnb's tree_allreduce bit for bit, message for message, and dist.all_reduce, with the
bytes of the formula (and a naive one is told apart); the pipeline step's gradients equal
one process and torch's pipelining, with the 1F1B / GPipe activation peaks of the formula;
the tensor-parallel checks equal the reference, their bytes equal the Megatron formula,
and the memory shrinks by 1/t; the PowerSGD step by hand equals both hooks (and one
without the orthogonalization does not); the cost measurement returns the gradient bytes
of its MLP; bad arguments are named on every rank before any message."""
import pytest
import torch

from ddnb.collectives.compare import compare_allreduce
from ddnb.compression.powersgd import compare_with_hooks
from ddnb.cost import allreduce_bytes_per_rank, peak_microbatches_in_flight
from ddnb.bench.measure import measure_first
from ddnb.models import GPTConfig
from ddnb.pipeline_parallel.demo import pipeline_step
from ddnb.runtime.errors import WorkerError
from ddnb.tensor_parallel.demo import (against_torch, check_against_reference, cross_entropies, held_shapes,
                                       measure_memory, traced_step)

TP_CFG = GPTConfig(vocab_size=16, seq_len=8, d_model=32, n_heads=4, n_layers=2)


def my_tree_allreduce(x):
    """Notebook 05's tree: binomial reduce to rank 0, then the same tree backwards."""
    import torch, torch.distributed as dist
    from ddnb.collectives.p2p import recv, send
    rank, n = dist.get_rank(), dist.get_world_size()
    incoming, mask = torch.empty_like(x), 1
    while mask < n:
        if rank & mask:
            send(x, rank - mask, name="reduce")
            break
        if rank + mask < n:
            recv(incoming, rank + mask, name="reduce")
            x += incoming
        mask <<= 1
    if rank != 0:
        recv(x, rank - mask, name="broadcast")
    mask >>= 1
    while mask > 0:
        if rank + mask < n:
            send(x, rank + mask, name="broadcast")
        mask >>= 1


def naive_by_hand(x):
    """Everything through rank 0: the right sum, not the tree's messages."""
    import torch, torch.distributed as dist
    from ddnb.collectives.p2p import recv, send
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        incoming = torch.empty_like(x)
        for src in range(1, n):
            recv(incoming, src)
            x += incoming
        for dst in range(1, n):
            send(x, dst)
    else:
        send(x, 0)
        recv(x, 0)


def test_tree_by_hand_equals_ddnb_and_torch_with_the_formula_bytes(world):
    numel = 1000
    out = world(4).run(compare_allreduce, my_tree_allreduce, "tree", numel)
    assert all(o["same_as_ddnb"] and o["same_messages"] and o["same_as_torch"] for o in out)
    assert [o["bytes_sent"] for o in out] == allreduce_bytes_per_rank("tree", numel * 4, 4) == [8000, 4000, 8000, 4000]
    naive = world(4).run(compare_allreduce, naive_by_hand, "tree", numel)
    assert all(o["same_as_torch"] for o in naive)                 # the right sum ...
    assert [o["same_messages"] for o in naive] == [False, True, False, False]   # ... by other messages (rank 1's are the same)
    assert [o["bytes_sent"] for o in naive] == [12000, 4000, 4000, 4000]


def test_compare_allreduce_names_bad_arguments_on_every_rank(world):
    w = world(4)
    with pytest.raises(WorkerError) as e:
        w.run(compare_allreduce, "not a function", "trees", 0)
    msg = str(e.value)
    assert "ranks [0, 1, 2, 3] raised" in msg and "fn must be a function" in msg and "algorithm" in msg and "numel" in msg
    assert w.run(lambda: 1) == [1, 1, 1, 1]


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_pipeline_step_equals_one_process_and_torch(world, name):
    cfg, m = GPTConfig(n_layers=2), 4
    out = world(4).run(pipeline_step, name, m, 1, 8, True, CFG=cfg)
    assert [r["layers"] for r in out] == [[(0, 1)], [(1, 2)], [(2, 3)], [(3, 4)]]
    assert all(r["ref_err"] < 1e-5 and r["torch_err"] < 1e-5 for r in out)
    assert all(abs(r["loss"] - r["ref_loss"]) < 1e-5 for r in out[-1:])
    one = world(4).run(pipeline_step, name, 1, 1, 2, False, CFG=cfg)       # one micro-batch of 2
    assert [r["peak"] // o["peak"] for r, o in zip(out, one)] == [
        peak_microbatches_in_flight(name, 4, m, rank) for rank in range(4)]
    assert all(r["peak"] % o["peak"] == 0 for r, o in zip(out, one))


def test_tensor_parallel_equals_the_reference_for_t_2_and_4(world):
    for t in (2, 4):
        res = [r for r in world(4).run(check_against_reference, t, TP_CFG) if r is not None]
        assert len(res) == t and set(res[0]) == {"MLP", "attention", "block", "GPT loss"}
        assert all(fwd < 1e-5 and grad < 1e-5 for r in res for fwd, grad in r.values())
    res = world(4).run(against_torch, 2, TP_CFG)
    assert res[2:] == [None, None]
    assert all(all(ok.values()) for ok, _ in res[:2]) and res[0][1] == {"ddnb": None, "torch": None}


def test_tensor_parallel_bytes_equal_megatrons_formula(world):
    B, T, d = 4, TP_CFG.seq_len, TP_CFG.d_model
    counts, nbytes, events = world(4).run(traced_step, 2, TP_CFG, "block")[0]
    assert counts == {("all_reduce", "forward"): 2, ("all_reduce", "backward"): 2}
    assert nbytes == {"forward": 2 * B * T * d * 4, "backward": 2 * B * T * d * 4}
    V, N = 256, 16
    out = world(4).run(cross_entropies, 4, V, N)[0]
    assert out["vocab-parallel"][:2] == (True, True) and out["gathered"][:2] == (True, True)
    assert out["vocab-parallel"][2:] == ({("all_reduce", "forward"): 3}, 3 * N * 4)
    assert out["gathered"][2:] == ({("all_gather", "forward"): 1}, N * V // 4 * 4)


def test_tensor_parallel_memory_per_rank_shrinks(world):
    one = world(4).run(measure_memory, 1, TP_CFG)[0][0]
    two = [r for r in world(4).run(measure_memory, 2, TP_CFG) if r is not None]
    assert len(two) == 2
    for mem, traffic in two:
        assert mem["gradients"] == mem["parameters"] and one["parameters"] / 2 <= mem["parameters"] < one["parameters"]
        assert set(traffic) == {"forward", "backward"}


def test_tensor_parallel_harnesses_name_bad_arguments(world):
    w = world(4)
    with pytest.raises(WorkerError) as e:
        w.run(traced_step, 5, TP_CFG, "layer")
    assert "ranks [0, 1, 2, 3] raised" in str(e.value) and "what" in str(e.value) and "t=5" in str(e.value)
    with pytest.raises(WorkerError) as e:
        w.run(cross_entropies, 3, 100, 8)
    assert "V=100 must be a multiple of t=3" in str(e.value)
    assert w.run(lambda: 1) == [1, 1, 1, 1]


def powersgd_by_hand(n, m, r, orthogonalize=True):
    """Notebook 14's step by hand: P = M Q, all-reduce, orthogonalize, Q = Mᵀ P̂, all-reduce / N."""
    import numpy as np, torch, torch.distributed as dist
    from ddnb.compression.powersgd import gram_schmidt
    N = dist.get_world_size()
    M = torch.randn(n, m, generator=torch.Generator().manual_seed(dist.get_rank()))
    with torch.random.fork_rng():
        torch.manual_seed(np.random.RandomState(0).randint(1_000_000_000))
        Q = gram_schmidt(torch.randn(1, m, r))[0]
    P = M @ Q
    dist.all_reduce(P)
    if orthogonalize:
        P = gram_schmidt(P[None])[0]
    Q = M.T @ P
    dist.all_reduce(Q); Q /= N
    return P @ Q.T, M


def test_powersgd_by_hand_equals_both_hooks(world):
    errs = world(4).run(compare_with_hooks, powersgd_by_hand, 16, 12, 2)
    assert all(a < 1e-5 and b < 1e-5 for a, b in errs)
    wrong = lambda n, m, r: powersgd_by_hand(n, m, r, orthogonalize=False)
    assert all(a > 1e-3 for a, _ in world(4).run(compare_with_hooks, wrong, 16, 12, 2))
    with pytest.raises(WorkerError) as e:
        world(4).run(compare_with_hooks, powersgd_by_hand, 4, 3, 3)
    assert "r=3 must be below min(n, m)" in str(e.value)


def test_measure_first_times_each_part_on_the_first_n_ranks(world):
    out = world(4).run(measure_first, 2, 1 << 16, 2, (4 << 10,))
    assert out[2:] == [None, None] and out[0]["n"] == 2
    r = out[0]
    assert r["sendrecv_sizes"] == [4 << 10, (1 << 16) // 2, 1 << 16] and len(r["sendrecv"]) == 3
    assert len(r["pingpong"]) == 1
    assert r["grad_bytes"] == 4 * (64 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10)
    assert all(r[k] > 0 for k in ("gamma", "ring", "tree", "compute", "step"))
    with pytest.raises(WorkerError) as e:
        world(4).run(measure_first, 5, 0)
    assert "n=5" in str(e.value) and "size" in str(e.value)


def test_held_shapes_are_the_rank_s_shards(world):
    d, h = TP_CFG.d_model, 4 * TP_CFG.d_model
    out = world(4).run(held_shapes, 4, TP_CFG)
    assert out == [{"fc.weight": (h // 4, d), "fc.bias": (h // 4,), "proj.weight": (d, h // 4), "proj.bias": (d,)}] * 4
    weights = sum(s[0] * s[1] for name, s in out[0].items() if name.endswith("weight"))
    assert weights == 2 * h * d // 4 == 2048                     # exercise 10.3's answer
    two = world(4).run(held_shapes, 2, TP_CFG, "attention")
    assert two[2:] == [None, None] and two[0]["qkv.weight"] == (3 * d // 2, d)
    with pytest.raises(WorkerError) as e:
        world(4).run(held_shapes, 3, TP_CFG, "head")
    assert "what" in str(e.value) and "ranks [0, 1, 2, 3] raised" in str(e.value)
