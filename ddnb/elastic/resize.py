"""Resize a training cluster in the middle of an epoch: checkpoint, change the number of
workers, reload resharded, go on.

    resize(cluster, n, state="state")       (also `cluster.resize(n, state="state")`)

    1. check n and that every engine holds an ElasticState named `state`  (nothing stops before)
    2. every rank: dcp.save(state.parts, directory)        `ddnb.elastic.checkpoint.save`
    3. cluster.resize(n): the process group is destroyed, engines are stopped (n < N) or
       started (n > N), and a new world of n ranks is formed (`ddnb.runtime.cluster`)
    4. every new rank: state = ElasticState(build); dcp.load(state.parts, directory)

An `ElasticState` is what the resize carries: a `build` function, run on every rank of
the current world, that makes the training state's parts fresh (model and optimizer
wrapped as `ModelState` or `ZeroState`, an `ElasticSampler`: each a DCP Stateful), and
those parts. Only `build` travels to the new ranks (by cloudpickle, from rank 0), the
values travel through the checkpoint: a rank that did not exist before the resize gets
its state from the files, as it would on a new machine. This is the restart-based
elasticity of torchelastic (`torchrun --nnodes MIN:MAX`): stop every worker, re-form
the world, restore from a checkpoint; here the checkpoint is resharded (DCP), so the
new world may have any size. Taught in `notebooks/15_elastic_training.ipynb`.

    cluster.run(start, functools.partial(digits_parts, seed=0), "state")  # on 4 ranks
    cluster.run(train_steps, "state", 5)
    resize(cluster, 2)                       # the same parameters, the epoch goes on
"""
from __future__ import annotations

import shutil
import tempfile

from ddnb._checks import Checks
from ddnb.elastic.checkpoint import load, save
from ddnb.runtime.placement import check_n


class ElasticState:
    """`build()` -> {name: Stateful}, made on the current world; `parts` holds them."""

    def __init__(self, build):
        if not callable(build):
            raise TypeError(f"ElasticState: build must be a function returning the state's parts, got {build!r}")
        self.build = build
        self.parts = build()
        if not isinstance(self.parts, dict) or not self.parts:
            raise TypeError(f"ElasticState: build() must return a non-empty dict of parts, got {self.parts!r}")

    def __getitem__(self, name: str):
        return self.parts[name]


def _namespace() -> dict:
    import __main__

    return __main__.__dict__        # what %%px cells see on an engine


def start(build, name: str = "state") -> None:
    """Runs on every rank: make an ElasticState from `build` and keep it as `name` in the
    engine's namespace (where %%px cells and `resize` find it)."""
    _namespace()[name] = ElasticState(build)


def get(name: str = "state") -> ElasticState:
    """Runs on a rank: the ElasticState kept as `name`."""
    return _namespace()[name]


def _holds(name: str) -> bool:
    return isinstance(_namespace().get(name), ElasticState)


def _save_on_rank(name: str, directory: str):
    import cloudpickle
    import torch.distributed as dist

    state = get(name)
    save(state.parts, directory)
    return cloudpickle.dumps(state.build) if dist.get_rank() == 0 else None


def _load_on_rank(build: bytes, name: str, directory: str) -> None:
    import cloudpickle

    state = ElasticState(cloudpickle.loads(build))
    load(state.parts, directory)
    _namespace()[name] = state


def resize(cluster, n: int, state: str = "state", directory=None):
    """Change `cluster` to n workers, carrying the ElasticState `state` of its engines
    across (see the module docstring); returns the cluster. `directory`: where the
    checkpoint goes (default: a temporary folder, removed once loaded; every worker must
    see it: one machine, or a shared file system). Bad n,
    a stopped cluster or a missing state are named before any worker stops."""
    with Checks("resize") as check:
        check_n(n, check=check)
        check.rule(isinstance(state, str) and state.isidentifier(),
                   f"state={state!r} must be the name of an ElasticState on the workers")
        check.rule(cluster.client is not None, "the cluster is stopped; call start() first")
    missing = [r for r, ok in enumerate(cluster.run(_holds, state)) if not ok]
    if missing:
        raise ValueError(f"resize: rank(s) {missing} hold no ElasticState named {state!r}: run "
                         f"cluster.run(ddnb.elastic.resize.start, build, {state!r}) first")
    if n == cluster.n:
        return cluster
    own = directory is None
    directory = tempfile.mkdtemp(prefix="ddnb-elastic-") if own else str(directory)
    build = cluster.run(_save_on_rank, state, directory)[0]
    cluster.resize(n)
    cluster.run(_load_on_rank, build, state, directory)
    if own:
        shutil.rmtree(directory, ignore_errors=True)     # loaded: the temporary checkpoint is spent
    return cluster
