"""Elastic training under torchrun (ddnb/elastic/torchrun_train.py), for real: two agents
on this machine (two "nodes" of one worker each, one c10d rendezvous), one killed with
SIGKILL, one added; training goes on from the checkpoint with the new world size, and
over the committed steps every example of the epoch is used exactly once."""
import os
import subprocess
import sys

import psutil
import pytest
import torch

from ddnb.elastic.torchrun_demo import committed_examples, kill_and_add
from ddnb.elastic.torchrun_train import (RDZV_CONF, check_launch, epoch_order, rank_part, replay,
                                         torchrun_command)
from ddnb.launch import _parser

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N_TRAIN = 1347          # the digits' training split
EVERY = 5


def test_kill_and_add_a_node_training_continues_each_example_once(tmp_path):
    out = kill_and_add(str(tmp_path), kill_after=12, add_after=3, every=EVERY)
    assert out["returncodes"]["a"] == 0 and out["returncodes"]["c"] == 0, open(tmp_path / "agent-a.out").read()
    assert out["world_sizes"][-3:] == [2, 1, 2], out["generations"]      # (a may first run alone, if b is slow)
    state, history, rows = out["state"], out["history"], out["rows"]
    assert state["done"] and [h["step"] for h in history] == list(range(1, len(history) + 1))
    # every generation after the first started from a checkpoint: right after a multiple of EVERY
    for _, _, first, _ in out["generations"][1:]:
        assert (first - 1) % EVERY == 0, out["generations"]
    # the committed steps used each example of the epoch exactly once, as the workers logged them
    seen = committed_examples(history, rows)
    assert seen == epoch_order(N_TRAIN, 0, 0).tolist() and out["each_example_once"]
    # the killed world's steps after its last checkpoint were run, and run again, but count once
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
