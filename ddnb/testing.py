"""Run a function on a gloo world of N processes, from pytest.

    from ddnb.testing import run_world

    def allreduce_rank():
        t = torch.tensor([float(dist.get_rank())])
        dist.all_reduce(t)
        return t.item()

    assert run_world(3, allreduce_rank) == [3.0, 3.0, 3.0]

`World(n)` keeps the processes (and their process group) alive across calls; `run_world`
is the one-shot form; `check_backend` says which backend a World of n ranks forms here.
This module is the public face that tests/ and `ddnb.bench` import; the processes, their
deadlines and their errors are `ddnb.runtime.world`'s (its docstring says how).
No notebook teaches it: it is the harness of tests/; notebooks use `ddnb.Cluster`
(`notebooks/00_getting_started.ipynb`).
"""
from ddnb.runtime.world import World, check_backend, run_world

__all__ = ["World", "check_backend", "run_world"]
