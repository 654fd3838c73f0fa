"""check_task_map (chapter 02) on a real 2-engine cluster: accepts the solution and
ipyparallel's own map, rejects a map that waits for each task before the next and one
that returns results in completion order, each with its hint."""
import pytest

from ddnb import Cluster
from ddnb.exercises.solutions.tasks import load_balanced_map
from ddnb.exercises.tasks import check_task_map


@pytest.fixture(scope="module")
def view():
    c = Cluster(n=2, timeout=60)
    yield c.client.load_balanced_view()
    c.stop()


def one_at_a_time(view, fn, items):
    return [view.apply_sync(fn, x) for x in items]


def in_completion_order(view, fn, items):
    import time

    pending, out = [view.apply_async(fn, x) for x in items], []
    while pending:
        for p in [p for p in pending if p.ready()]:
            out.append(p.get())
            pending.remove(p)
        time.sleep(0.01)
    return out


def tickets(view, fn, items):
    return [view.apply_async(fn, x) for x in items]


@pytest.mark.parametrize("fn", [load_balanced_map, lambda view, fn, items: view.map_sync(fn, items)])
def test_accepts_correct_maps(view, fn):
    assert check_task_map(fn, view) == "✓ check_task_map: 8 results in submission order, tasks ran side by side"


@pytest.mark.parametrize("fn, hint", [
    (one_at_a_time, r"the 8 tasks ran one at a time \(.* s\) on 2 engines: .* Submit them all with apply_async first"),
    (in_completion_order, r"result 0: expected fn\(0\) = 0, got 1\. the results are in the order the tasks finished"),
    (tickets, r"the results are AsyncResults \(tickets\), not values: call \.get\(\) on each"),
])
def test_rejects_wrong_maps_with_a_hint(view, fn, hint):
    with pytest.raises(AssertionError, match=hint):
        check_task_map(fn, view)


def test_refuses_bad_arguments():
    with pytest.raises(ValueError, match=r"map_fn=1: need a function.*view=None: need an ipyparallel view"):
        check_task_map(1, None)
