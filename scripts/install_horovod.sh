#!/usr/bin/env bash
# Build and install Horovod 0.28.1 with PyTorch and Gloo into the current Python.
#
# Horovod's last release compiles its torch extension as C++14, and torch >= 2.1 needs
# C++17 ("#error C++17 or later compatible compiler is required to use PyTorch").
# Upstream fixed it in PR #3998, never released. So: download the sdist, set
# CMAKE_CXX_STANDARD to 17 in CMakeLists.txt and horovod/torch/CMakeLists.txt, build
# without build isolation (against the torch already installed).
#
# Idempotent: does nothing when `import horovod.torch` already works. A built wheel is
# cached in $DDNB_CACHE (default ~/.cache/ddnb), keyed by the Horovod, torch and Python
# versions, so a second checkout on the same machine installs in seconds.
# Where CUDA (nvcc) and NCCL are present, Horovod's NCCL operations are built too.
#
# Usage: scripts/install_horovod.sh [PYTHON]   (default: python)
set -euo pipefail
PY=${1:-python}
VERSION=0.28.1
CACHE=${DDNB_CACHE:-$HOME/.cache/ddnb}
LOG=${HOROVOD_BUILD_LOG:-$CACHE/horovod-build.log}
mkdir -p "$CACHE"

if "$PY" -c "import horovod.torch" 2>/dev/null; then
    echo "horovod: $("$PY" -c 'import horovod; print(horovod.__version__)') with torch already installed, nothing to do"
    exit 0
fi

die() { echo "install_horovod.sh: error: $*" >&2; exit 1; }
command -v cmake >/dev/null || die "cmake is not installed (apt-get install cmake, or pip install 'cmake<4'); it is needed to build Horovod"
command -v "${CXX:-g++}" >/dev/null || die "no C++ compiler (${CXX:-g++}) found (apt-get install g++); it is needed to build Horovod"
command -v make >/dev/null || die "make is not installed (apt-get install make)"
"$PY" -c "import torch" 2>/dev/null || die "torch must be installed before Horovod (it is built against it)"

tag=$("$PY" -c "import sys, torch; print(f'torch{torch.__version__.split(\"+\")[0]}-py{sys.version_info[0]}{sys.version_info[1]}-' + ('cuda' if torch.version.cuda else 'cpu'))")
wheeldir="$CACHE/horovod-$VERSION-$tag"
whl=$(ls "$wheeldir"/horovod-*.whl 2>/dev/null | head -n1 || true)
if [ -n "$whl" ]; then
    echo "horovod: installing the wheel built earlier: $whl"
    "$PY" -m pip install --no-deps --no-build-isolation "$whl"
else
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    echo "horovod: downloading the $VERSION sdist"
    "$PY" -m pip download --no-deps --no-binary :all: "horovod==$VERSION" -d "$work" >/dev/null \
        || die "could not download horovod==$VERSION from the package index"
    tar -xzf "$work/horovod-$VERSION.tar.gz" -C "$work"
    src="$work/horovod-$VERSION"
    for f in "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"; do
        grep -q 'set(CMAKE_CXX_STANDARD 14)' "$f" || die "$f has no 'set(CMAKE_CXX_STANDARD 14)' to patch"
        sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$f"
    done
    export CMAKE_POLICY_VERSION_MINIMUM=3.5 HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 \
        HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
        HOROVOD_CPU_OPERATIONS=GLOO
    if command -v nvcc >/dev/null && "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() and torch.cuda.nccl.version() else 1)" 2>/dev/null; then
        echo "horovod: CUDA and NCCL found, building the NCCL operations too"
        export HOROVOD_GPU_OPERATIONS=NCCL
    fi
    export MAKEFLAGS="-j$(nproc)"
    echo "horovod: building $VERSION against $tag (about 5 minutes on 2 cores); log: $LOG"
    "$PY" -m pip install cloudpickle psutil pyyaml packaging "cffi>=1.4.0" wheel setuptools >/dev/null
    mkdir -p "$wheeldir"
    if ! "$PY" -m pip wheel --no-deps --no-build-isolation -w "$work/dist" "$src" >"$LOG" 2>&1; then
        tail -n 40 "$LOG" >&2
        die "the Horovod build failed; the whole log is in $LOG"
    fi
    cp "$work"/dist/horovod-*.whl "$wheeldir/"
    "$PY" -m pip install --no-deps "$wheeldir"/horovod-*.whl
fi
"$PY" -c "import horovod.torch" || die "horovod installed but 'import horovod.torch' fails"
echo "horovod: $("$PY" -c 'import horovod; print(horovod.__version__)') installed with PyTorch and Gloo"
