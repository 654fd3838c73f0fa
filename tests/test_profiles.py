"""The example ipcluster profiles (examples/profiles/ssh and slurm, issue 8 item 5) run for
real: `ipcluster start` with the profile, through ipyparallel's own SSH and Slurm launchers,
then ddnb.Cluster connects to the engines and all-reduces; `ipcluster stop` ends them.

No second machine and no Slurm here, so `ssh`/`scp` and `sbatch`/`srun`/`scancel` are small
stand-ins first on PATH that do their job on this machine: ssh drops its options and host
and runs the command with sh in $HOME, as sshd would; sbatch runs the job script in a new
session (its id is the job id) with SLURM_NTASKS from its #SBATCH --ntasks line; srun starts
that many copies of its command; scancel kills the job's session. Everything else (the
profile, the written job script, the engines' command lines and connection files) is
ipyparallel's and the profile's own.
"""
import contextlib
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from ddnb.runtime.cluster import Cluster
from ddnb.timing import time_allreduce
from test_cluster import _stop_ipcluster

PROFILES = Path(__file__).resolve().parent.parent / "examples" / "profiles"

FAKE = {
    "ssh": r"""#!/bin/bash
# ssh [options] [--] host [--] command...: run the command here, in $HOME, with sh
while [ $# -gt 0 ]; do
  case "$1" in
    -[oplFiEJ]) shift 2 ;;
    --) shift ;;
    -*) shift ;;
    *) shift; break ;;   # the host
  esac
done
[ "${1:-}" = "--" ] && shift
cd "$HOME" && exec sh -c "$*"
""",
    "scp": r"""#!/bin/bash
# scp [options] src dst, either of them host:path: copy here
args=(); while [ $# -gt 0 ]; do case "$1" in -[oPiF]) shift 2 ;; -*) shift ;; *) args+=("$1"); shift ;; esac; done
src=${args[0]#*:}; dst=${args[1]#*:}
cd "$HOME" && { [ "$src" -ef "$dst" ] || cp "$src" "$dst"; }
""",
    "sbatch": r"""#!/bin/bash
# sbatch script: run it in a new session, SLURM_NTASKS from '#SBATCH --ntasks=N'
script="${@: -1}"
n=$(sed -n 's/^#SBATCH --ntasks=\([0-9]*\).*/\1/p' "$script")
SLURM_NTASKS=${n:-1} setsid bash "$script" >"$script.out" 2>&1 </dev/null &
echo "Submitted batch job $!"
""",
    "srun": r"""#!/bin/bash
# srun [--options] command...: SLURM_NTASKS copies of the command
while [[ "${1:-}" == --* ]]; do shift; done
for ((i = 0; i < ${SLURM_NTASKS:-1}; i++)); do SLURM_PROCID=$i "$@" & done
wait
""",
    "scancel": r"""#!/bin/bash
# scancel [-s SIGNAL] jobid: signal the job's session
sig=TERM; [ "$1" = "-s" ] && { sig=$2; shift 2; }
kill -s "$sig" -- "-$1" 2>/dev/null; exit 0
""",
}


@pytest.fixture
def fake_bin(tmp_path, monkeypatch):
    """A folder of the stand-ins, first on PATH (ipcluster and its launchers inherit it)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in FAKE.items():
        path = bin_dir / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir


def copy_profile(name, tmp_path, **settings):
    """The example profile in a fresh profile directory, with its settings edited as a user
    would (`NAME = value` lines at the top of the file)."""
    profile = tmp_path / f"profile_{name}"
    shutil.copytree(PROFILES / name, profile)
    config = profile / "ipcluster_config.py"
    text = config.read_text()
    for key, value in settings.items():
        text, count = re.subn(rf"^{key} = .*$", f"{key} = {value!r}", text, flags=re.M)
        assert count == 1, f"{config} has no '{key} = ...' line"
    config.write_text(text)
    return profile


def engines_of(cluster_id):
    """pids of the running ipengines of this cluster id, by their command line or, where a
    launcher passes it so (ssh), their environment."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        argv = p.info["cmdline"] or []
        if "ipyparallel.engine" not in argv[1:3]:     # python -m ipyparallel.engine, no shell
            continue
        cmd = " ".join(argv)
        with contextlib.suppress(psutil.Error):
            if f"--cluster-id={cluster_id}" in cmd or p.environ().get("IPP_CLUSTER_ID") == cluster_id:
                found.append(p.info["pid"])
    return found


def run_profile(profile, cluster_id, n, interrupt: bool = False):
    """ipcluster start with the profile; connect ddnb.Cluster; a real all-reduce; stop:
    `ipcluster stop`, or with `interrupt` a Ctrl-C (SIGINT) to `ipcluster start`."""
    ipcluster = os.path.join(os.path.dirname(sys.executable), "ipcluster")
    args = [f"--profile-dir={profile}", f"--cluster-id={cluster_id}"]
    with open(profile / "ipcluster.out", "wb") as out:
        proc = subprocess.Popen([ipcluster, "start", "-n", str(n), "--log-level=INFO", *args],
                                stdout=out, stderr=subprocess.STDOUT, cwd=profile.parent)
    try:
        c = Cluster(n=n, cluster_id=cluster_id, profile_dir=str(profile), timeout=60, start_timeout=90)
        assert [w["rank"] for w in c.workers] == list(range(n)) and c.backend == "gloo"
        pids = c.run(os.getpid)
        assert sorted(pids) == sorted(engines_of(cluster_id))   # the profile's engines, all of them
        assert c.run(time_allreduce, 1000, iters=2)[0] > 0       # one torch.distributed world
        c.stop()
        if interrupt:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            _stop_ipcluster(proc, [ipcluster, "stop", *args])
    deadline = time.monotonic() + 30
    while engines_of(cluster_id) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = engines_of(cluster_id)
    for pid in left:
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()
    assert not left, f"engines left running after ipcluster stop: {left}"
    return pids


@pytest.mark.slow
def test_ssh_profile_starts_engines_on_each_listed_host(fake_bin, tmp_path):
    """Stopped with Ctrl-C: `ipcluster stop` works too but takes ~15 s per engine here, as
    ipyparallel's stop looks again (10 tries, 1 s apart) for each engine's log, which the
    start process has already fetched and removed (examples/profiles/README.md)."""
    profile = copy_profile("ssh", tmp_path, HOSTS={"node1": 2, "user@node2": 1})
    run_profile(profile, "ddnb-ssh", 3, interrupt=True)
    log = (profile / "ipcluster.out").read_text()
    # ipyparallel's SSH launcher went to each host the profile lists, with its ssh options
    ssh_to = re.findall(r"ShellCommandSend object \(\['ssh'\], \[(.*)\]", log)
    assert {a.rsplit(", ", 1)[-1] for a in ssh_to} == {"'node1'", "'user@node2'"}, log
    assert all("'BatchMode=yes'" in a for a in ssh_to)


@pytest.mark.slow
def test_slurm_profile_submits_one_job_of_n_tasks(fake_bin, tmp_path):
    profile = copy_profile("slurm", tmp_path, PARTITION="gpu", ACCOUNT="proj123")
    run_profile(profile, "ddnb-slurm", 3)
    script = (profile / "slurm_engine.sbatch").read_text()
    for line in ["#SBATCH --ntasks=3", "#SBATCH --partition=gpu", "#SBATCH --account=proj123",
                 "#SBATCH --time=01:00:00", "#SBATCH --job-name=ddnb-engines-ddnb-slurm",
                 f"#SBATCH --output={profile}/log/ddnb-engines-%j.log"]:
        assert line in script.splitlines(), f"{line!r} not in the job script:\n{script}"
    srun = [l for l in script.splitlines() if l.startswith("srun ")]
    # the engines find the profile and cluster id in the environment (--export=ALL)
    assert srun == [f"srun --kill-on-bad-exit=1 {sys.executable} -m ipyparallel.engine"]
