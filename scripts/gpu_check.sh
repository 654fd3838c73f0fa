#!/usr/bin/env bash
# The GPU checks: every test marked `gpu` (tests/test_gpu.py: the from-scratch all-reduces
# on CUDA tensors over gloo and over nccl with one GPU per rank, data parallelism on CUDA,
# the bucketed path's async all-reduce and find_unused_parameters, backend="auto" with one
# rank per GPU, the parameter server on nccl, timing on nccl), then every notebook top to
# bottom on this machine (`--nbval-lax`: outputs are not compared, since GPU numbers differ
# from the stored CPU ones, but a cell that raises fails; the stored notebooks are not
# rewritten). Run it on a machine with CUDA, from the repository:
#     bash scripts/gpu_check.sh            (or: make test-gpu)
# PY picks the interpreter (default .venv/bin/python); its torch must be a CUDA build
# (`make setup` on a Linux x86_64 machine that reaches PyPI gets one: PyPI's torch wheel
# is built with CUDA; the CPU build is only what this project's CI machines keep on disk).
set -euo pipefail
PY=${PY:-.venv/bin/python}
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=index,name,memory.total --format=csv || true
"$PY" - <<'PYEOF'
import sys
import torch
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.device_count()} device(s) visible")
if not torch.cuda.is_available():
    sys.exit("no CUDA device visible to this torch (a CPU build, or no driver): the gpu tests would all be skipped")
PYEOF
"$PY" -m pytest tests -m gpu -rs -p no:cacheprovider "$@"
# after the tests' worlds are gone, as `make test` does; NOTEBOOKS="notebooks/00_getting_started.ipynb ..."
# picks fewer (the arguments above are pytest's for the tests only)
exec "$PY" -m pytest ${NOTEBOOKS:-notebooks} --nbval-lax --nbval-current-env -p no:cacheprovider --durations=15
