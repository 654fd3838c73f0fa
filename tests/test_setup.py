"""The set-up scripts: idempotent, and clear when a build tool is missing."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STAMP = Path(sys.prefix) / ".ddnb-setup"


@pytest.mark.skipif(not STAMP.exists(), reason="not running in a venv made by scripts/setup.sh")
def test_a_second_setup_installs_nothing():
    env = dict(os.environ, VENV=sys.prefix)
    out = subprocess.run(["bash", "scripts/setup.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "is up to date" in out.stdout and "nothing to install" in out.stdout
    assert "installing" not in out.stdout


def test_horovod_script_skips_when_horovod_imports():
    pytest.importorskip("horovod.torch")
    out = subprocess.run(["bash", "scripts/install_horovod.sh", sys.executable], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "nothing to do" in out.stdout


def test_horovod_script_names_a_missing_cmake(tmp_path):
    """With no cmake on PATH (and a Python without Horovod) the script stops at once and
    says what to install, instead of failing deep inside a build."""
    bare = tmp_path / "bin"
    bare.mkdir()
    python = shutil.which("python3", path="/usr/bin:/usr/local/bin") or sys.executable
    for tool in ("mkdir", "bash"):
        os.symlink(shutil.which(tool), bare / tool)
    os.symlink(python, bare / "python-without-horovod")
    probe = subprocess.run([python, "-c", "import horovod.torch"], capture_output=True)
    if probe.returncode == 0:
        pytest.skip(f"{python} has Horovod: the script would rightly do nothing")
    env = {"PATH": str(bare), "HOME": str(tmp_path), "DDNB_CACHE": str(tmp_path / "cache")}
    out = subprocess.run([shutil.which("bash"), "scripts/install_horovod.sh", "python-without-horovod"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "cmake is not installed" in out.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize("target", ["setup", "lab", "test", "test-unit", "test-notebooks", "test-gpu", "notebooks", "clean"])
def test_every_make_target_parses(target):
    """A broken Makefile fails CI before anything runs ('missing separator', exit 2): each
    target the README names is read and planned (make -n runs nothing)."""
    out = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "warning" not in out.stderr.lower(), out.stderr
