"""Elastic Horovod (ddnb/elastic/horovod_train.py), for real: horovodrun -np 2 --min-np 1
--max-np 3 with a host discovery script over two "hosts" of this machine (localhost and
127.0.0.1); the test rewrites the hosts file to remove a slot (2 -> 1 workers: Horovod
stops one), add two (1 -> 3: it starts new ones, synced from rank 0), then SIGKILLs a
worker on 127.0.0.1 (a failure: the survivors restore the last commit, the host is
blacklisted, 1 worker goes on). Every example of the epoch is used once over the
committed steps, and the model equals one process replaying them. With one host only, a
failed worker ends the job (Horovod blacklists its only host), hence two.
"""
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch

from ddnb.elastic.horovod_train import discovery_script, horovodrun_command
from ddnb.elastic.torchrun_train import epoch_order, replay

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOROVODRUN = os.path.join(os.path.dirname(sys.executable), "horovodrun")
N_TRAIN = 1347

pytestmark = [pytest.mark.horovod,
              pytest.mark.skipif(not os.path.exists(HOROVODRUN) and not shutil.which("horovodrun"),
                                 reason="horovodrun is not installed")]


def _rows(log_dir):
    rows = []
    for f in glob.glob(os.path.join(log_dir, "hvd-*.jsonl")):
        with open(f) as fh:
            rows += [json.loads(line) for line in fh if line.endswith("\n")]
    return sorted(rows, key=lambda r: r["time"])


def _wait(what, cond, deadline, proc, out, poll=0.2):
    while not cond():
        if time.monotonic() > deadline or proc.poll() is not None:
            raise AssertionError(f"waiting for {what}: horovodrun exit code {proc.poll()}; output:\n"
                                 + open(out).read()[-3000:])
        time.sleep(poll)


def _hosts(path, text):
    with open(path, "w") as f:
        f.write(text)


def test_remove_add_and_fail_training_continues(tmp_path):
    log_dir, hosts = str(tmp_path), str(tmp_path / "hosts")
    _hosts(hosts, "localhost:1\n127.0.0.1:1\n")                  # two "hosts", both this machine
    script = discovery_script(str(tmp_path / "discover.sh"), hosts)
    out = str(tmp_path / "horovodrun.out")
    # a worker stuck in a collective with the killed one gives up after 10 s, not Gloo's 30
    env = dict(os.environ, PYTHONPATH=ROOT, DDNB_THREADS="1", HOROVOD_GLOO_TIMEOUT_SECONDS="10")
    cmd = horovodrun_command(2, 1, 3, script, log_dir, every=5, step_delay=0.1,
                             horovodrun=HOROVODRUN if os.path.exists(HOROVODRUN) else "horovodrun")
    proc = subprocess.Popen(cmd, env=env, stdout=open(out, "w"), stderr=subprocess.STDOUT, cwd=log_dir,
                            start_new_session=True)
    t0 = time.monotonic()
    count = lambda ws: sum(r["world_size"] == ws for r in _rows(log_dir))      # noqa: E731
    try:
        _wait("12 steps at 2 workers", lambda: count(2) >= 24, t0 + 60, proc, out)
        _hosts(hosts, "localhost:1\n")                              # remove a slot
        _wait("3 steps at 1 worker", lambda: count(1) >= 3, t0 + 90, proc, out)
        _hosts(hosts, "localhost:1\n127.0.0.1:2\n")                 # add two
        # kill after a commit at 3 workers, between two commits, so the restore has steps to undo
        _wait("a step 5k+2 at 3 workers", lambda: count(3) >= 21 and max(
            r["step"] for r in _rows(log_dir) if r["world_size"] == 3) % 5 in (2, 3), t0 + 120, proc, out, poll=0.02)
        victim = next(r["pid"] for r in reversed(_rows(log_dir)) if r["host"] == "127.0.0.1")
        os.kill(victim, signal.SIGKILL)                              # a worker fails: restore, blacklist
        _wait("horovodrun to finish", lambda: proc.poll() is not None, t0 + 170, proc, out)
    finally:
        procs = []
        try:
            procs = psutil.Process(proc.pid).children(recursive=True) + [psutil.Process(proc.pid)]
        except psutil.NoSuchProcess:
            pass
        for q in procs:
            try:
                q.kill()
            except psutil.NoSuchProcess:
                pass
        proc.wait(timeout=10)
    assert proc.returncode == 0, open(out).read()[-3000:]
    final = json.load(open(os.path.join(log_dir, "final.json")))
    history, rows = final["history"], _rows(log_dir)
    assert [h["step"] for h in history] == list(range(1, len(history) + 1))
    sizes = [h["world_size"] for h in history]
    collapsed = [s for i, s in enumerate(sizes) if i == 0 or s != sizes[i - 1]]
    assert collapsed == [2, 1, 3, 1], collapsed
    # each committed step: its ranks (their last run of it) used exactly the global batch
    seen = []
    for h in history:
        last = {}
        for r in rows:
            if (r["step"], r["start"], r["world_size"]) == (h["step"], h["start"], h["world_size"]):
                last[r["rank"]] = r["indices"]
        assert sorted(last) == list(range(h["world_size"])), h
        got = [i for rank in sorted(last) for i in last[rank]]
        assert got == epoch_order(N_TRAIN, 0, 0)[h["start"]:h["stop"]].tolist()
        seen += got
    assert sorted(seen) == list(range(N_TRAIN))
    # slot changes interrupt at a commit; the failure restores the last commit: its steps ran again
    changes = [i for i in range(1, len(history)) if sizes[i] != sizes[i - 1]]
    assert all((history[i]["step"] - 1) % 5 == 0 for i in changes), [history[i] for i in changes]
    redone = len(rows) - sum(sizes)
    assert redone > 0 and redone % 3 == 0                         # whole 3-worker steps, run twice
    ref = [v for v in replay(history).state_dict().values()]
    for got, want in zip(final["params"], ref):
        assert torch.allclose(torch.tensor(got), want, atol=1e-5)


def test_min_above_max_is_a_clear_error_never_a_hang(tmp_path):
    script = discovery_script(str(tmp_path / "discover.sh"), str(tmp_path / "hosts"))
    with pytest.raises(ValueError) as e:
        horovodrun_command(2, 3, 1, script, str(tmp_path), every=0)
    assert "min_np=3 > max_np=1" in str(e.value) and "every=0" in str(e.value)
    with pytest.raises(ValueError, match=r"np=5 is not in \[min_np=1, max_np=3\]"):
        horovodrun_command(5, 1, 3, script, str(tmp_path))
    # and horovodrun itself, given min > max, exits with an error (here within 60 s), no hang
    _hosts(tmp_path / "hosts", "localhost:2\n")
    cmd = [HOROVODRUN if os.path.exists(HOROVODRUN) else "horovodrun", "-np", "2", "--min-np", "3", "--max-np", "1",
           "--host-discovery-script", script, "--network-interface", "lo", "--gloo", sys.executable, "-c", "pass"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "Requested more processes (3) than there are available slots (1)" in r.stderr
