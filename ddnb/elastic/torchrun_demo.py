"""A node killed and a node added, for real, on this machine: the harness behind the
elastic torchrun test and notebook 14's demonstration of `torchrun_train.py`.

    out = kill_and_add("/tmp/elastic-run")
    out["world_sizes"]          # [2, 1, 2]: the world size of each generation in turn
    out["each_example_once"]    # True: the committed steps used the epoch exactly once

Three torchrun agents (`python -m ddnb.launch elastic --nnodes 1:4 --nproc-per-node 1`,
one c10d rendezvous on localhost; agent a hosts its store): a and b start, so the world
has 2 ranks; after `kill_after` steps, b and its worker are SIGKILLed (a node lost: a's
worker sees the broken connection, a restarts it in a new round of 1 rank, from the last
checkpoint); after `add_after` steps at 1 rank, agent c starts (a node added: a sees it
waiting, stops its worker, and a round of 2 starts, again from the checkpoint). Every wait
has a deadline; every process is killed at the end, whatever happened. Taught in
`notebooks/15_elastic_training.ipynb`.
"""
from __future__ import annotations

import glob
import json
import os
import signal
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def start_agent(port: int, ckpt_dir: str, name: str, host_store: bool, per_rank: int = 8, every: int = 5,
                step_delay: float = 0.1) -> subprocess.Popen:
    """One torchrun agent (a "node" of one worker) in its own session; output in agent-<name>.out."""
    env = dict(os.environ, PYTHONPATH=ROOT, DDNB_THREADS="1", OMP_NUM_THREADS="1", LOGLEVEL="INFO")
    out = open(os.path.join(ckpt_dir, f"agent-{name}.out"), "w")
    return subprocess.Popen([sys.executable, "-m", "ddnb.launch", "elastic", "--nnodes", "1:4",
                             "--rdzv-endpoint", f"localhost:{port}", "--store-host", "yes" if host_store else "no",
                             "--max-restarts", "5", "--ckpt-dir", ckpt_dir, "--per-rank", str(per_rank),
                             "--every", str(every), "--step-delay", str(step_delay), "--timeout", "20"],
                            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)


def kill_tree(p: subprocess.Popen) -> None:
    """SIGKILL the agent and every process under it (its workers run in sessions of their own)."""
    import psutil

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


def log_rows(ckpt_dir: str) -> list:
    """Every worker's step lines (`torchrun_train.train_elastic`), in time order."""
    rows = []
    for f in glob.glob(os.path.join(ckpt_dir, "log", "*.jsonl")):
        with open(f) as fh:
            rows += [json.loads(line) for line in fh if line.endswith("\n")]
    return sorted(rows, key=lambda r: r["time"])


def generations(rows) -> list:
    """[(gen, world_size, first step, last step)] in the order the generations started."""
    first: dict = {}
    for r in rows:
        g = first.setdefault(r["gen"], [r["world_size"], r["step"], r["step"]])
        g[2] = max(g[2], r["step"])
    return [(g, *v) for g, v in first.items()]


def committed_examples(history, rows) -> list:
    """The example indices the committed steps of `history` trained on, as the workers
    logged them (rank order within a step); each must appear once per epoch."""
    by_step: dict = {}
    for r in rows:
        by_step.setdefault((r["gen"], r["step"]), {})[r["rank"]] = r["indices"]
    out = []
    for h in history:
        parts = by_step.get((h["gen"], h["step"]), {})
        if sorted(parts) != list(range(h["world_size"])):
            raise AssertionError(f"step {h['step']}: logs of ranks {sorted(parts)}, world size {h['world_size']}")
        out += [i for r in sorted(parts) for i in parts[r]]
    return out


def _wait(what: str, cond, deadline: float, agents: dict) -> None:
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"kill_and_add: timed out waiting for {what}; agents' exit codes "
                               f"{ {k: p.poll() for k, p in agents.items()} }")
        time.sleep(0.1)


def kill_and_add(ckpt_dir: str, kill_after: int = 12, add_after: int = 3, per_rank: int = 8, every: int = 5,
                 step_delay: float = 0.1, timeout: float = 150) -> dict:
    """Run the scenario of the module docstring in `ckpt_dir` (new or empty); returns
    {"world_sizes", "generations", "history", "rows", "returncodes", "state",
    "each_example_once"}. Raises TimeoutError if a phase misses its deadline."""
    import torch

    from ddnb.data import digits

    os.makedirs(ckpt_dir, exist_ok=True)
    port, t0 = free_port(), time.monotonic()
    agents = {"a": start_agent(port, ckpt_dir, "a", True, per_rank, every, step_delay),
              "b": start_agent(port, ckpt_dir, "b", False, per_rank, every, step_delay)}
    latest = lambda ws: (lambda g: g[-1][3] - g[-1][2] + 1 if g and g[-1][1] == ws else -1)(  # noqa: E731
        generations(log_rows(ckpt_dir)))
    try:
        _wait(f"{kill_after} steps at 2 ranks", lambda: latest(2) >= kill_after, t0 + timeout / 3, agents)
        kill_tree(agents["b"])                                           # a node lost
        _wait(f"{add_after} steps at 1 rank", lambda: latest(1) >= add_after, t0 + timeout / 2, agents)
        agents["c"] = start_agent(port, ckpt_dir, "c", False, per_rank, every, step_delay)   # a node added
        for name in ("a", "c"):
            _wait(f"agent {name} to finish", lambda: agents[name].poll() is not None, t0 + timeout, agents)
    finally:
        for p in agents.values():
            kill_tree(p)
    rows = log_rows(ckpt_dir)
    gens = generations(rows)
    state = torch.load(os.path.join(ckpt_dir, "checkpoint.pt"), weights_only=False)
    sizes = [g[1] for g in gens]
    seen = committed_examples(state["history"], rows)
    n = len(digits(seed=0)[0])                                           # one epoch of the training split
    return {"world_sizes": [s for i, s in enumerate(sizes) if i == 0 or s != sizes[i - 1]], "generations": gens,
            "history": state["history"], "rows": rows, "state": state,
            "returncodes": {k: p.returncode for k, p in agents.items()},
            "each_example_once": sorted(seen) == list(range(n))}
