"""%px / %%px on a ddnb.Cluster's ranks, and what a %%px cell says when a worker dies.

`Cluster` activates its view for ipyparallel's magics (`enable`): a cell runs on every
rank, blocking, not streamed, its outputs grouped by engine in rank order, without a
progress bar, so that it prints the same every run (nbval compares it).

ipyparallel labels a %%px output or error by *engine id* ("[stdout:3]", "[5:execute]"),
and a worker whose process dies as "Engine 5 died while running task ...". Engine ids
are ipyparallel's bookkeeping; they equal the ranks only until a `resize` or `restart`.
So when a %%px cell fails because an engine died, `enable`'s handler shows the usual
error and then names the rank behind each dead engine, its pid and host, and what to do:

    ddnb: rank 2 (engine 5, pid 4242 on node1) died during this %%px cell; the other ranks'
    errors follow from it: call cluster.restart()

`Cluster.run` says the same in its WorkerLostError. Used by `ddnb.Cluster` (the %%px
cells of every notebook); tested in tests/test_px.py.
Taught in `notebooks/00_getting_started.ipynb`; %%px cells run from `notebooks/03_collectives.ipynb` on.
"""
from __future__ import annotations

import functools
import re
import sys
import weakref

DIED = re.compile(r"Engine (\d+) died while running task")


def enable(cluster) -> None:
    """Point %px / %%px at `cluster`'s ranks (in rank order) and install the lost-worker
    message; nothing to do outside IPython."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None:
        return
    cluster.view.activate()
    magics = shell.magics_manager.registry.get("ParallelMagics")
    if magics is not None:
        magics.stream_output = False
        magics.progress_after_seconds = -1
    from ipyparallel.error import CompositeError

    # the handler holds the cluster whose view %px now uses (weakly: it may be dropped)
    shell.set_custom_exc((CompositeError,), functools.partial(_show_with_ranks, weakref.ref(cluster)))


def dead_engines(error) -> list[int]:
    """Engine ids that an ipyparallel CompositeError reports as died, in its order."""
    found = []
    for ename, evalue, _tb, _info in getattr(error, "elist", []):
        m = DIED.search(str(evalue)) if ename == "EngineError" else None
        if m and int(m.group(1)) not in found:
            found.append(int(m.group(1)))
    return found


def lost_worker_message(workers, error) -> str | None:
    """The line naming the rank of each dead engine in `error` (workers: Cluster.workers,
    dicts with rank, engine_id, pid, host), or None when no engine died."""
    by_engine = {w["engine_id"]: w for w in workers}
    names = []
    for eid in dead_engines(error):
        w = by_engine.get(eid)
        names.append(f"rank {w['rank']} (engine {eid}, pid {w['pid']} on {w['host']})" if w
                     else f"engine {eid} (not a rank of this cluster)")
    if not names:
        return None
    return (f"ddnb: {', '.join(names)} died during this %%px cell; the other ranks' errors follow "
            f"from it: call cluster.restart()")


def _show_with_ranks(cluster_ref, shell, etype, value, tb, tb_offset=None):
    """IPython's handler for a %px CompositeError: the usual error, then the ranks lost."""
    shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
    cluster = cluster_ref()
    message = lost_worker_message(cluster.workers, value) if cluster is not None else None
    if message:
        print(message, file=sys.stderr)
