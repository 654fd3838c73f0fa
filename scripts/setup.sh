#!/usr/bin/env bash
# One-command set-up, called by `make lab` and `make test`:
#   1. create the virtual environment $VENV (default .venv) if it is missing;
#   2. install torch==$TORCH (a CPU build on this machine), then ddnb with its notebook,
#      test and Horovod dependencies;
#   3. build Horovod with PyTorch and Gloo (scripts/install_horovod.sh);
#   4. install Debian's chromium for tests/test_browser.py where it can (root, apt-get);
#      without it that test is skipped, and the set-up goes on.
# Idempotent: a stamp in the venv records what was installed (the torch version and a
# hash of pyproject.toml and these scripts); when it matches, nothing is installed again.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
TORCH=${TORCH:-2.13.0}
PY="$VENV/bin/python"

command -v "$PYTHON" >/dev/null || { echo "setup: $PYTHON not found; install Python >= 3.9" >&2; exit 1; }
if [ ! -x "$PY" ]; then
    echo "setup: creating $VENV with $("$PYTHON" --version)"
    "$PYTHON" -m venv "$VENV"
fi

want="torch=$TORCH $(cat pyproject.toml scripts/setup.sh scripts/install_horovod.sh | sha256sum | cut -c1-16)"
stamp="$VENV/.ddnb-setup"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$PY" -c "import ddnb, torch, ipyparallel, horovod.torch" 2>/dev/null; then
    echo "setup: $VENV is up to date (torch $TORCH, Horovod built); nothing to install"
    exit 0
fi

export PIP_DISABLE_PIP_VERSION_CHECK=1
# pip -q, without the warnings that a machine's pip.conf may add about missing local indexes
pip_install() { "$PY" -m pip install -q "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }
pip_install --upgrade pip setuptools wheel
echo "setup: installing torch==$TORCH"
pip_install "torch==$TORCH"
echo "setup: installing ddnb and its dependencies"
pip_install -e ".[dev,horovod]"
# litdata (notebook 01b) without its declared torchvision: ddnb never imports torchvision, and
# resolving it would pull the newest torchvision and with it a newer torch over the pinned one
# (a PyPI torchvision next to a CPU torch also fails on import). Its other needs are in pyproject.toml.
pip_install --no-deps "litdata>=0.2.50"
bash scripts/install_horovod.sh "$PY"
if [ ! -x /usr/bin/chromium ]; then   # Playwright drives this one; it never downloads a browser
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        log="${DDNB_CACHE:-$HOME/.cache/ddnb}/chromium-install.log"
        mkdir -p "$(dirname "$log")"
        echo "setup: installing chromium with apt-get (for the browser test); log: $log"
        { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium; } \
            >"$log" 2>&1 || true
    fi
    [ -x /usr/bin/chromium ] || echo "setup: no /usr/bin/chromium here; the browser test (tests/test_browser.py) will be skipped"
fi
echo "$want" >"$stamp"
echo "setup: done. torch $("$PY" -c 'import torch; print(torch.__version__)'), horovod $("$PY" -c 'import horovod; print(horovod.__version__)')"
