"""Elastic training under torchrun (ddnb/elastic/torchrun_train.py), for real: two agents
on this machine (two "nodes" of one worker each, one c10d rendezvous), one killed with
SIGKILL, one added; training goes on from the checkpoint with the new world size, and
over the committed steps every example of the epoch is used exactly once."""
import glob
import json
import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest
import torch

from ddnb.elastic.torchrun_train import (RDZV_CONF, check_launch, epoch_order, rank_part, replay,
                                         torchrun_command)
from ddnb.launch import _parser

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N_TRAIN = 1347          # the digits' training split
EVERY = 5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _agent(port: int, ckpt: str, name: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=ROOT, DDNB_THREADS="1", OMP_NUM_THREADS="1", LOGLEVEL="INFO")
    out = open(os.path.join(ckpt, f"agent-{name}.out"), "w")
    return subprocess.Popen([sys.executable, "-m", "ddnb.launch", "elastic", "--nnodes", "1:4",
                             "--rdzv-endpoint", f"localhost:{port}",
                             "--store-host", "yes" if name == "a" else "no",         # a hosts the store
                             "--max-restarts", "5", "--ckpt-dir", ckpt,
                             "--per-rank", "8", "--every", str(EVERY), "--step-delay", "0.1", "--timeout", "20"],
                            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)


def _lines(ckpt: str) -> list:
    rows = []
    for f in glob.glob(os.path.join(ckpt, "log", "*.jsonl")):
        with open(f) as fh:
            rows += [json.loads(line) for line in fh if line.endswith("\n")]
    return rows


def _gens(rows) -> list:
    """[(gen, world_size, first step, last step)] in the order the generations started."""
    first: dict = {}
    for r in sorted(rows, key=lambda r: r["time"]):
        g = first.setdefault(r["gen"], [r["world_size"], r["step"], r["step"]])
        g[2] = max(g[2], r["step"])
    return [(g, *v) for g, v in first.items()]


def _latest(ckpt: str, world_size: int) -> int:
    """Steps the latest generation has run, if its world size is `world_size`, else -1."""
    gens = _gens(_lines(ckpt))
    return gens[-1][3] - gens[-1][2] + 1 if gens and gens[-1][1] == world_size else -1


def _wait(what: str, cond, deadline: float, procs):
    while not cond():
        if time.monotonic() > deadline:
            outs = {p.args[-1]: p.poll() for p in procs}
            raise AssertionError(f"timed out waiting for {what}; agents' exit codes {outs}")
        time.sleep(0.1)


def _kill_tree(p: subprocess.Popen) -> None:
    """SIGKILL the agent and every process under it (its workers run in their own sessions)."""
    try:
        procs = psutil.Process(p.pid).children(recursive=True) + [psutil.Process(p.pid)]
    except psutil.NoSuchProcess:
        procs = []
    for q in procs:
        try:
            os.kill(q.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    p.wait(timeout=10)


def test_kill_and_add_a_node_training_continues_each_example_once(tmp_path):
    ckpt, port = str(tmp_path), _free_port()
    agents = {"a": _agent(port, ckpt, "a")}
    agents["b"] = _agent(port, ckpt, "b")
    t0 = time.monotonic()
    try:
        procs = lambda: list(agents.values())              # noqa: E731
        _wait("12 steps at world size 2", lambda: any(r["world_size"] == 2 and r["step"] >= 12
                                                      for r in _lines(ckpt)), t0 + 60, procs())
        _kill_tree(agents["b"])                           # a real kill: the node is gone
        _wait("3 steps at world size 1 after the kill", lambda: _latest(ckpt, 1) >= 3, t0 + 90, procs())
        agents["c"] = _agent(port, ckpt, "c")             # a real add
        for name in ("a", "c"):
            _wait(f"agent {name} to finish", lambda: agents[name].poll() is not None, t0 + 150, procs())
        assert [agents[k].returncode for k in ("a", "c")] == [0, 0], open(os.path.join(ckpt, "agent-a.out")).read()
    finally:
        for p in agents.values():
            _kill_tree(p)
    rows = _lines(ckpt)
    gens = _gens(rows)
    sizes = [ws for _, ws, _, _ in gens]
    collapsed = [s for i, s in enumerate(sizes) if i == 0 or s != sizes[i - 1]]
    assert collapsed[-3:] == [2, 1, 2], gens
    state = torch.load(os.path.join(ckpt, "checkpoint.pt"), weights_only=False)
    history = state["history"]
    assert state["done"] and [h["step"] for h in history] == list(range(1, len(history) + 1))
    # every generation after the first started from a checkpoint: right after a multiple of EVERY
    for _, _, first, _ in gens[1:]:
        assert (first - 1) % EVERY == 0, gens
    # the committed steps used each example of the epoch exactly once, as the workers logged them
    by_step = {}
    for r in rows:
        by_step.setdefault((r["gen"], r["step"]), []).append(r)
    seen = []
    for h in history:
        parts = sorted(by_step[(h["gen"], h["step"])], key=lambda r: r["rank"])
        assert [r["rank"] for r in parts] == list(range(h["world_size"]))
        seen += [i for r in parts for i in r["indices"]]
        assert seen[-(h["stop"] - h["start"]):] == epoch_order(N_TRAIN, 0, 0)[h["start"]:h["stop"]].tolist()
    assert sorted(seen) == list(range(N_TRAIN))
    # and some steps were run twice (by the killed world), but count once
    assert len(rows) > sum(h["world_size"] for h in history)
    # the elastic run equals one process training on the committed global batches
    ref = replay(history)
    for k, v in ref.state_dict().items():
        assert torch.allclose(state["model"][k], v, atol=1e-5), k
    # no process left behind
    assert not any(psutil.pid_exists(r["pid"]) and psutil.Process(r["pid"]).status() != psutil.STATUS_ZOMBIE
                   for r in rows)


def test_rank_part_covers_the_batch():
    batch = torch.arange(21)
    for n in (1, 2, 3, 4):
        assert torch.cat([rank_part(batch, r, n) for r in range(n)]).tolist() == batch.tolist()


def test_bad_arguments_named_before_anything_starts():
    with pytest.raises(ValueError) as e:
        check_launch("4:1", 0, "localhost:99999", -1, per_rank=0)
    msg = str(e.value)
    for part in ("min nodes 4 > max nodes 1", "99999", "nproc_per_node", "max_restarts", "per_rank"):
        assert part in msg
    r = subprocess.run([sys.executable, "-m", "ddnb.launch", "elastic", "--nnodes", "3:2", "--ckpt-dir", "/tmp/x"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode != 0 and "min nodes 3 > max nodes 2" in r.stderr


def test_command_uses_c10d_rendezvous():
    args = _parser().parse_args(["elastic", "--nnodes", "1:4", "--rdzv-endpoint", "localhost:29555",
                                 "--max-restarts", "2", "--ckpt-dir", "/tmp/x"])
    cmd = torchrun_command(args)
    joined = " ".join(cmd)
    for part in ("torch.distributed.run", "--nnodes 1:4", "--rdzv-backend c10d", "--rdzv-endpoint localhost:29555",
                 "--max-restarts 2", f"--rdzv-conf {RDZV_CONF}", "-m ddnb.elastic.torchrun_train",
                 "--ckpt-dir /tmp/x"):
        assert part in joined
