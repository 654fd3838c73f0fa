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
