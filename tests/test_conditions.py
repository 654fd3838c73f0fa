"""ddnb.runtime.conditions: the facts stated at the top of every notebook, and the quiet-machine
check that `make notebooks` (scripts/run_notebooks.py) runs before storing outputs."""
import os
import subprocess
import sys

import pytest

from ddnb.runtime import conditions as cond


def test_conditions_state_cores_load_and_mode():
    c = cond.conditions()
    assert c.cores == len(os.sched_getaffinity(0)) and c.cpu and c.others >= 0
    text = str(c)
    assert f"{c.cores} cores" in text and "real processes" in text and f"load average {c.load:.1f}" in text
    assert "profile '10gbe'" in str(cond.conditions(emulate="10gbe"))


def test_busy_when_load_is_above_the_limit_and_quiet_otherwise(monkeypatch):
    monkeypatch.setattr(cond, "other_clusters", lambda: [])
    monkeypatch.setattr(os, "getloadavg", lambda: (5.0, 1.0, 1.0))
    assert cond.busy_reasons(max_load=2) == ["load average 5.0 over the last minute is above 2"]
    monkeypatch.setattr(os, "getloadavg", lambda: (0.5, 1.0, 1.0))
    assert cond.busy_reasons(max_load=2) == []


def test_another_cluster_is_found_and_own_children_are_not():
    # a process outside this test's tree (its shell parent exits, so it is re-parented)
    # that looks like an engine: the machine is busy
    out = subprocess.run(["sh", "-c", f"{sys.executable} -c 'import time; time.sleep(30)' ipyparallel.engine "
                                      ">/dev/null 2>&1 & echo $!"], capture_output=True, text=True, timeout=30)
    pid = int(out.stdout)
    try:
        found = [p for p in cond.other_clusters() if f"pid {pid}:" in p]
        assert len(found) == 1 and "ipyparallel.engine" in found[0]
        assert any("processes of other ddnb clusters" in r for r in cond.busy_reasons(max_load=1e9))
    finally:
        os.kill(pid, 9)


def test_own_child_is_not_another_cluster():
    mine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "ipyparallel.engine"])
    try:
        assert not [p for p in cond.other_clusters() if f"pid {mine.pid}:" in p]
    finally:
        mine.kill()
        mine.wait()


def test_run_notebooks_refuses_on_a_busy_machine(tmp_path):
    nb = tmp_path / "x.ipynb"
    nb.write_text('{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}')
    script = os.path.join(os.path.dirname(__file__), "..", "scripts", "run_notebooks.py")
    code = ("import os, sys, runpy; os.getloadavg = lambda: (99.0, 99.0, 99.0); "
            f"sys.argv = [{script!r}, {str(nb)!r}, '--wait', '0']; runpy.run_path({script!r}, run_name='__main__')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 3 and "not run; the machine is busy" in out.stderr and "load average 99.0" in out.stderr
    assert nb.read_text().startswith('{"cells": []')
