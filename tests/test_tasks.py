"""Task parallelism (ddnb.tasks): configurations, run_tasks on a real 2-engine cluster
(submission order, failures and timeouts reported, not raised), ensembles, and the plots."""
import matplotlib

matplotlib.use("Agg")

import pytest
import torch

from ddnb import Cluster
from ddnb.search import LogUniform, check_config, ensemble_accuracy, grid, random_search, train_digits_task
from ddnb.tasks import TaskResult, results_table, run_tasks, task_events, time_task_set

SMALL = {"steps": 30, "hidden": 16}


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(n=2, timeout=60)
    yield c
    c.stop()


@pytest.fixture(scope="module")
def view(cluster):
    return cluster.client.load_balanced_view()


def _hang(config):
    import time

    while True:
        time.sleep(0.05)


def _hang_stubbornly(config):
    """Swallows the TaskTimeoutError raised in it, so only the client's SIGINT stops it."""
    import time

    while True:
        try:
            time.sleep(0.05)
        except Exception:
            pass


def _double(x):
    return 2 * x


# ------------------------------------------------------------------ configurations
def test_grid_is_complete_ordered_and_merged():
    configs = grid(base={"steps": 5}, lr=[0.01, 0.1, 1.0], hidden=[16, 64])
    assert len(configs) == 6
    assert configs[0] == {"steps": 5, "lr": 0.01, "hidden": 16}
    assert configs[1] == {"steps": 5, "lr": 0.01, "hidden": 64}            # last axis fastest
    assert {(c["lr"], c["hidden"]) for c in configs} == {(a, b) for a in (0.01, 0.1, 1.0) for b in (16, 64)}
    assert grid(base={"steps": 5}, lr=[0.01, 0.1, 1.0], hidden=[16, 64]) == configs


def test_random_search_is_seeded_and_in_range():
    space = dict(lr=LogUniform(1e-3, 1.0), hidden=[16, 32, 64], steps=50)
    a, b = random_search(20, seed=3, **space), random_search(20, seed=3, **space)
    assert a == b and len(a) == 20
    assert random_search(20, seed=4, **space) != a
    assert all(1e-3 <= c["lr"] <= 1.0 and c["hidden"] in (16, 32, 64) and c["steps"] == 50 for c in a)
    assert len({c["lr"] for c in a}) == 20               # a fresh learning rate every trial
    assert random_search(5, seed=3, **space) == a[:5]    # a prefix of the same stream


@pytest.mark.parametrize("call, words", [
    (lambda: grid(), ["at least one axis"]),
    (lambda: grid(lr=[]), ["lr=[]"]),
    (lambda: grid(lr=0.1), ["lr=0.1"]),
    (lambda: random_search(0, lr=LogUniform(0.1, 1)), ["n=0"]),
    (lambda: random_search(3), ["search space"]),
    (lambda: random_search(3, hidden=[]), ["hidden"]),
    (lambda: LogUniform(0, 1), ["low=0"]),
    (lambda: LogUniform(1, 0.5), ["low=1", "high=0.5"]),
    (lambda: check_config({"lr": -1, "hidden": 0, "depth": 3}), ["lr=-1: need a number > 0", "hidden=0",
                                                                 "unknown keys ['depth']"]),
    (lambda: ensemble_accuracy(torch.ones(2, 3, 4), torch.zeros(5, dtype=torch.long)), ["(2, 3, 4)"]),
    (lambda: ensemble_accuracy(torch.ones(2, 3, 4), torch.zeros(3, dtype=torch.long), method="max"), ["max"]),
])
def test_bad_input_says_what_is_wrong(call, words):
    with pytest.raises(ValueError) as e:
        call()
    assert all(w in str(e.value) for w in words), str(e.value)


@pytest.mark.parametrize("kwargs, words", [
    (dict(configs=[]), ["non-empty list"]),
    (dict(configs=[], timeout=-5, deadline=0), ["configs=[]", "timeout=-5", "deadline=0"]),
    (dict(configs=[SMALL], timeout=0), ["timeout", "0"]),
    (dict(configs=[SMALL], timeout=-5), ["timeout", "-5"]),
    (dict(configs=[SMALL], timeout=None), ["timeout", "None"]),
    (dict(configs=[SMALL], deadline=0), ["deadline"]),
])
def test_run_tasks_rejects_bad_input_before_submitting(view, kwargs, words):
    with pytest.raises(ValueError) as e:
        run_tasks(view, train_digits_task, **kwargs)
    assert all(w in str(e.value) for w in words), str(e.value)
    with pytest.raises(ValueError, match="ipyparallel view"):
        run_tasks(object(), train_digits_task, [SMALL])


# ------------------------------------------------------------------ on the cluster
def test_results_in_submission_order_failure_reported_equal_to_one_process(view):
    configs = grid(base=SMALL, lr=[0.05, 0.3], seed=[0, 1])
    configs.insert(1, {"lr": 0.1, "hidden": 0})                  # a bad config, second of five
    seen = []
    results = run_tasks(view, train_digits_task, configs, timeout=60, progress=lambda *a: seen.append(a))
    assert [r.index for r in results] == list(range(5))
    assert [r.config for r in results] == configs
    assert [r.status for r in results] == ["ok", "error", "ok", "ok", "ok"]
    bad = results[1]
    assert bad.error.startswith("ValueError: bad task config: hidden=0: need an integer >= 1")
    assert bad.value is None
    for r in results:
        if r.ok:   # the same as training in this process (the same seeds, the same batches)
            ref = train_digits_task(r.config)
            assert r.value["test_accuracy"] == pytest.approx(ref["test_accuracy"], abs=1e-6)
            assert r.value["train_loss"] == pytest.approx(ref["train_loss"], rel=1e-4)
            assert r.engine_id is not None and r.end >= r.start
    assert len(seen) == 5 and seen[-1][:2] == (5, 5)            # progress: once per task, to 5 of 5
    table = results_table(results)
    assert list(table.index) == list(range(5))
    assert list(table["status"]) == ["ok", "error", "ok", "ok", "ok"]
    assert {"lr", "hidden", "test_accuracy", "error", "engine"} <= set(table.columns)
    assert [e["status"] for e in task_events(results)] == [r.status for r in results]


def test_a_hanging_task_times_out_and_the_others_finish(view):
    configs = [0, 1, "hang", 2, 3]
    fn = lambda c: _hang(c) if c == "hang" else _double(c)
    results = run_tasks(view, fn, configs, timeout=5, progress=False)
    assert [r.status for r in results] == ["ok", "ok", "timeout", "ok", "ok"], results
    assert [r.value for r in results] == [0, 2, None, 4, 6]
    # stopped on its engine (TaskTimeoutError), or, on a machine too busy for that to be
    # seen in time, interrupted from the client (TimeoutError ... interrupted)
    assert "TimeoutError: still running after 5 s" in results[2].error, results[2].error
    again = run_tasks(view, _double, [5, 6, 7], timeout=30, progress=False)     # both engines free again
    assert [r.value for r in again] == [10, 12, 14]


def test_a_task_that_ignores_its_timeout_is_interrupted(view):
    results = run_tasks(view, lambda c: _hang_stubbornly(c) if c < 0 else _double(c), [-1, 1, 2],
                        timeout=1, progress=False)
    assert [r.status for r in results] == ["timeout", "ok", "ok"]
    assert "interrupted" in results[0].error
    again = run_tasks(view, _double, [1, 2, 3, 4], timeout=30, progress=False)
    assert [r.status for r in again] == ["ok"] * 4


def test_the_deadline_reports_tasks_still_queued(cluster):
    one = cluster.client.load_balanced_view(targets=[cluster.workers[0]["engine_id"]])
    # the first task ignores its timeout, the deadline comes before the client's interrupt
    results = run_tasks(one, lambda c: _hang_stubbornly(c) if c == "hang" else c, ["hang", 1], timeout=2,
                        deadline=3, progress=False)
    assert [r.status for r in results] == ["timeout", "timeout"], results
    assert all("deadline of 3 s" in r.error for r in results)
    assert [r.value for r in run_tasks(one, _double, [1, 2], timeout=30, progress=False)] == [2, 4]


def test_ensemble_is_at_least_as_good_as_its_worst_member(view):
    configs = [{"lr": 0.1, "hidden": 32, "steps": 60, "seed": s, "return_probs": True} for s in range(5)]
    results = run_tasks(view, train_digits_task, configs, timeout=60, progress=False)
    assert all(r.ok for r in results)
    probs = [r.value["probs"] for r in results]                  # 5 x (450, 10)
    singles = [r.value["test_accuracy"] for r in results]
    from ddnb.data import digits

    _, test = digits(seed=0)
    mean, vote = ensemble_accuracy(probs, test.y), ensemble_accuracy(probs, test.y, method="vote")
    assert [ensemble_accuracy(p[None], test.y) for p in probs] == pytest.approx(singles, abs=1e-6)
    assert mean >= min(singles) and vote >= min(singles)
    assert mean >= sum(singles) / len(singles)                   # observed: above the mean member


def test_time_task_set_runs_the_same_work_on_1_and_2_engines(cluster):
    eids = [w["engine_id"] for w in cluster.workers]
    times = time_task_set(cluster.client, eids, train_digits_task, [SMALL] * 4, counts=(1, 2))
    assert sorted(times) == [1, 2] and all(t > 0 for t in times.values())
    with pytest.raises(ValueError, match="1..2"):
        time_task_set(cluster.client, eids, train_digits_task, [SMALL], counts=(1, 4))
    with pytest.raises(RuntimeError, match="hidden"):
        time_task_set(cluster.client, eids, train_digits_task, [{"hidden": 0}], counts=(1,))


# ------------------------------------------------------------------ without a cluster
def test_ensemble_accuracy_by_hand():
    labels = torch.tensor([0, 1, 2])
    a = torch.tensor([[0.9, 0.1, 0.0], [0.6, 0.4, 0.0], [0.0, 0.0, 1.0]])   # right, wrong, right
    b = torch.tensor([[0.4, 0.6, 0.0], [0.0, 1.0, 0.0], [0.0, 0.4, 0.6]])   # wrong, right, right
    assert ensemble_accuracy([a, b], labels) == pytest.approx(1.0)           # mean: 0.65, 0.7, 0.8
    # vote: one vote each for classes 0 and 1 on the first two examples; ties go to class 0
    assert ensemble_accuracy([a, b], labels, method="vote") == pytest.approx(2 / 3)


def test_plots_draw_from_plain_data():
    import matplotlib.pyplot as plt

    from ddnb.viz import plot_ensemble, plot_search, plot_task_timeline

    results = [TaskResult(0, {"lr": 0.1, "hidden": 16}, "ok", {"test_accuracy": 0.9}, None, 1, 0.0, 1.0),
               TaskResult(1, {"lr": 0.5, "hidden": 0}, "error", None, "ValueError: bad", 2, 0.1, 0.2),
               TaskResult(2, {"lr": 1.0, "hidden": 64}, "timeout", None, "TaskTimeoutError: x", 1, 1.0, 3.0)]
    ax = plot_task_timeline(task_events(results), title="tasks")
    assert [t.get_text() for t in ax.get_yticklabels()] == ["engine 1", "engine 2"]
    rows = results_table(results).to_dict("records")
    ax = plot_search(rows, "lr", "hidden", "test_accuracy")
    assert ax.get_xscale() == "log"
    ax = plot_ensemble([0.9, 0.92, 0.91], {"mean": 0.95, "vote": 0.94})
    assert len(ax.patches) == 3 and len(ax.get_lines()) == 2
    with pytest.raises(ValueError, match="at least one"):
        plot_ensemble([], {})
    plt.close("all")
