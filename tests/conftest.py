"""Shared fixtures: `world(n)` gives a live gloo world of n ranks (ddnb.testing.World),
started once per size for the whole session and replaced if a test broke it;
`world(n, horovod=True)` one with Horovod initialized too, closed after its module."""
import pytest

from ddnb.testing import World

_worlds: dict = {}


@pytest.fixture(scope="session")
def world():
    def get(n: int, horovod: bool = False) -> World:
        key = (n, horovod)
        w = _worlds.get(key)
        if w is None or w.broken:
            w = _worlds[key] = World(n, timeout=60, horovod=horovod)
        return w

    yield get
    for w in _worlds.values():
        w.close()
    _worlds.clear()


@pytest.fixture(scope="module", autouse=True)
def _close_horovod_worlds():
    """Horovod worlds live for one test module only: an initialized Horovod's background
    thread keeps polling even when idle (here about 1.3 cores for 2 ranks), which would
    slow every test and notebook that runs after it."""
    yield
    for key in [k for k in _worlds if k[1]]:
        _worlds.pop(key).close()


def horovod_available() -> bool:
    from ddnb.runtime.horovod import horovod_available as available

    return available()


requires_horovod = pytest.mark.skipif(not horovod_available(), reason="Horovod with PyTorch is not installed")


def bsp_reference(model_fn, workers: int, steps: int, batch_size: int, lr: float, momentum: float = 0.0, seed: int = 0):
    """Single-process SGD on the N workers' batches concatenated (`worker_batch`, digits):
    what every synchronous (BSP) parameter-server or all-reduce run must equal. Returns
    the flat parameters (S,)."""
    import torch
    import torch.nn.functional as F

    from ddnb.data import digits
    from ddnb.models import flat_params
    from ddnb.parameter_server.worker import worker_batch

    train_set, _ = digits(seed=0)
    model = model_fn()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    for t in range(steps):
        xs, ys = zip(*(worker_batch(train_set, w, workers, batch_size, t, seed) for w in range(workers)))
        opt.zero_grad()
        F.cross_entropy(model(torch.cat(xs)), torch.cat(ys)).backward()
        opt.step()
    return flat_params(model)
