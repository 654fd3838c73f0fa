"""ddnb.elastic.checkpoint: DCP checkpoints saved by N ranks and loaded by M != N, for a
replicated model + Adam, ddnb's ZeRO-3 (and ZeRO-1) shards and torch FSDP2; the loaded parameters and
Adam moments equal the saved ones exactly (torch.equal), gathered over all ranks."""
import pytest
import torch
import torch.distributed as dist

from ddnb.elastic.checkpoint import ModelState, ZeroState, full_adam_state, load, save, valid_numel
from ddnb.models import flat_params, mlp

SIZES = (64, 37, 10)   # 64·37+37 = 2405 and 37·10+10 = 380: neither divides by 2, 3 or 4


def _batch(step):
    g = torch.Generator().manual_seed(step)
    return torch.randn(24, 64, generator=g), torch.randint(0, 10, (24,), generator=g)   # (24, 64), (24,)


def _train(model, opt, steps, shard=False):
    r, n = dist.get_rank(), dist.get_world_size()
    for step in range(steps):
        x, y = _batch(step)
        if shard:
            x, y = x[r::n], y[r::n]
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()


def _adam_full(opt, params):
    out = []
    for p in params:
        st = opt.state[p]
        for key in ("exp_avg", "exp_avg_sq"):
            v = st[key]
            out.append((v.full_tensor() if hasattr(v, "full_tensor") else v).reshape(-1))
    return torch.cat(out)


def _params_full(model):
    return torch.cat([(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().reshape(-1)
                      for p in model.parameters()])


def replicated(directory, saving):
    model = mlp(SIZES, seed=0 if saving else 7)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    if saving:
        _train(model, opt, 3)
        save({"train": ModelState(model, opt)}, directory)
    else:
        load({"train": ModelState(model, opt)}, directory)
    return flat_params(model), _adam_full(opt, list(model.parameters()))


def fsdp2(directory, saving):
    from torch.distributed.fsdp import fully_shard

    model = mlp(SIZES, seed=0 if saving else 7)
    for layer in model:
        if any(True for _ in layer.parameters()):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    if saving:
        _train(model, opt, 3, shard=True)
        save({"train": ModelState(model, opt)}, directory)
    else:
        load({"train": ModelState(model, opt)}, directory)
    return _params_full(model), _adam_full(opt, list(model.parameters()))


def zero3(directory, saving, stage=3):
    from ddnb.sharding import ZeroStage1, ZeroStage3

    zero = (ZeroStage3 if stage == 3 else ZeroStage1)(mlp(SIZES, seed=0 if saving else 7), lr=1e-2)
    if saving:
        _train(zero, zero, 3, shard=True)
        save({"train": ZeroState(zero)}, directory)
    else:
        load({"train": ZeroState(zero)}, directory)
    adam = full_adam_state(zero)
    return zero.full_parameters(), torch.cat([adam["exp_avg"], adam["exp_avg_sq"]]), adam["step"]


def zero1(directory, saving):
    return zero3(directory, saving, stage=1)


def _same_everywhere(saved, loaded):
    for got in loaded:
        for a, b in zip(saved[0], got):
            if isinstance(a, torch.Tensor):
                assert a.shape == b.shape and torch.equal(a, b)
            else:
                assert a == b


@pytest.mark.parametrize("kind, n, m", [(replicated, 2, 3), (zero3, 2, 3), (zero3, 4, 2), (zero1, 4, 3),
                                        (fsdp2, 2, 3), (fsdp2, 4, 2)], ids=lambda v: getattr(v, "__name__", v))
def test_saved_on_n_loaded_on_m_is_exact(world, tmp_path, kind, n, m):
    saved = world(n).run(kind, str(tmp_path), True)
    loaded = world(m).run(kind, str(tmp_path), False)
    _same_everywhere(saved, loaded)
    assert not torch.equal(flat_params(mlp(SIZES, seed=7)), saved[0][0])   # the loading model started elsewhere


def test_fsdp2_sharded_on_4_loads_into_a_replicated_model_on_2(world, tmp_path):
    # the checkpoint holds global tensors, not a layout: sharded state loads unsharded
    saved = world(4).run(fsdp2, str(tmp_path), True)
    loaded = world(2).run(replicated, str(tmp_path), False)
    _same_everywhere(saved, loaded)


def test_zero3_shards_are_the_dtensor_chunks():
    # ceil-sized chunks, the last short or empty: what DTensor's Shard(0) gives each rank
    assert [valid_numel(10, 3, r) for r in range(4)] == [3, 3, 3, 1]
    assert [valid_numel(9, 3, r) for r in range(4)] == [3, 3, 3, 0]
    assert [valid_numel(2405, 802, r) for r in range(3)] == [802, 802, 801]


def test_bad_directory_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"holds no DCP checkpoint \(no .metadata file\)"):
        load({}, str(tmp_path))
    with pytest.raises(ValueError, match=r"directory=None must be a path"):
        save({}, None)
