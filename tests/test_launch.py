"""ddnb.launch and ddnb.data_parallel.train: the training chapters as scripts.

`train_digits` on a live world equals one process on the global batch across an epoch
boundary (the sampler reshuffles); `python -m ddnb.launch dp` runs under torchrun and
horovodrun (real launchers, 2 processes) and reproduces the single-process reference;
bad arguments and a missing launcher fail with a message before any process group forms.
"""
import json
import os
import subprocess
import sys

import pytest

from conftest import requires_horovod
from ddnb.data_parallel.train import reference_digits, train_digits
from ddnb.launch import launcher_backend, launcher_env, local_ranks, main, set_threads
from ddnb.runtime.worker import threads_for

BIN = os.path.dirname(sys.executable)
# 674 training digits on 2 ranks, 32 a step: an epoch is 10 steps, so 12 steps cross into epoch 1
STEPS = 12


@pytest.mark.parametrize("strategy, layers", [("naive", 1), ("bucketed", 3), ("ddp", 1)])
def test_train_digits_equals_one_process_on_the_global_batch(world, strategy, layers):
    ref = reference_digits(2, steps=STEPS, per_rank=32, hidden=32, layers=layers)
    got = world(2).run(train_digits, strategy, steps=STEPS, per_rank=32, hidden=32, layers=layers)
    for r in got:
        assert (r["params"] - ref["params"]).abs().max().item() < 1e-5
        assert r["losses"] == pytest.approx(ref["losses"], abs=1e-5)
        assert r["accuracy"] == pytest.approx(ref["accuracy"])
    assert [r["rank"] for r in got] == [0, 1] and got[0]["losses"][-1] < got[0]["losses"][0]


def test_launcher_detected_from_the_environment():
    assert launcher_env({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"}) == "horovodrun"
    assert launcher_env({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}) == "torchrun"
    assert launcher_env({"RANK": "1"}) == "none"


def test_local_ranks_from_any_launcher():
    assert local_ranks({"LOCAL_WORLD_SIZE": "4"}) == 4                 # torchrun
    assert local_ranks({"HOROVOD_LOCAL_SIZE": "3"}) == 3               # horovodrun --gloo
    assert local_ranks({"OMPI_COMM_WORLD_LOCAL_SIZE": "2"}) == 2       # horovodrun over mpirun
    assert local_ranks({}) == local_ranks({"LOCAL_WORLD_SIZE": "x"}) == 1


def test_horovodrun_ranks_get_their_share_of_the_cores(monkeypatch):
    """What init_from_launcher sizes before hvd.init(): horovodrun sets no thread count."""
    import torch

    before = torch.get_num_threads()
    monkeypatch.delenv("DDNB_THREADS", raising=False)
    for var in ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                "OPENBLAS_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOROVOD_LOCAL_SIZE", "2")
    try:
        assert set_threads() == threads_for(2) == torch.get_num_threads()
        monkeypatch.setenv("DDNB_THREADS", "3")
        assert set_threads() == 3 == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def test_launcher_backend_gives_gpus_gloo_and_nccl():
    assert launcher_backend(gpus=0, local_size=1) == "gloo"
    assert launcher_backend(gpus=2, local_size=4) == "gloo"            # not one GPU per local rank
    assert launcher_backend(gpus=2, local_size=2) == "cpu:gloo,cuda:nccl"


@pytest.mark.parametrize("argv, message", [
    (["dp", "--steps", "0"], "steps=0: need an integer >= 1"),
    (["dp", "--lr", "-1"], r"lr=-1.0: need a number > 0"),
    (["dp", "--layers", "0"], "layers=0: need an integer >= 1"),
    (["dp", "--steps", "0", "--lr", "0"],
     r"ddnb.launch: train_digits: steps=0: need an integer >= 1; lr=0.0: need a number > 0"),
    (["dp", "--strategy", "ddp"], "runs under torchrun"),
    (["dp", "--strategy", "horovod"], "runs under horovodrun"),
])
def test_bad_arguments_or_no_launcher_say_so(argv, message, monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "HOROVOD_RANK"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(SystemExit, match=message):
        main(argv)


def _rank0_row(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [line[line.index("{"):] for line in out.stdout.splitlines() if '"strategy"' in line]
    assert len(rows) == 1, out.stdout     # only rank 0 prints
    return json.loads(rows[0])


def test_torchrun_runs_the_chapter_and_matches_one_process():
    row = _rank0_row([os.path.join(BIN, "torchrun"), "--standalone", "--nproc-per-node", "2", "-m", "ddnb.launch",
                      "dp", "--strategy", "bucketed", "--steps", str(STEPS), "--compare"])
    assert row["world_size"] == 2 and row["max_param_diff_vs_single_process"] < 1e-5
    assert row["final_loss"] < row["first_loss"]
    assert row["threads"] == threads_for(2)   # cores / 2 local ranks, not torchrun's OMP_NUM_THREADS=1


@requires_horovod
def test_horovodrun_runs_the_chapter_and_matches_one_process():
    row = _rank0_row([os.path.join(BIN, "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo",
                      sys.executable, "-m", "ddnb.launch", "dp", "--strategy", "horovod", "--steps", str(STEPS),
                      "--compare"])
    assert row["world_size"] == 2 and row["max_param_diff_vs_single_process"] < 1e-5
    assert row["threads"] == threads_for(2)   # horovodrun sets no thread count; ddnb.launch does
    ref = reference_digits(2, steps=STEPS)
    assert row["final_loss"] == pytest.approx(ref["losses"][-1], abs=1e-5)
