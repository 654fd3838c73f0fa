#!/usr/bin/env bash
# The GPU checks: every test marked `gpu`, then every notebook on this machine.
#
# The tests (each the check of its CPU test, with the tensors on the rank's GPU, over gloo
# with the ranks sharing the GPUs there are and over nccl with one GPU per rank):
#   tests/test_gpu.py          the from-scratch all-reduces on CUDA tensors against
#                              torch.distributed; data parallelism on CUDA (naive, bucketed,
#                              DDP) against one CPU process; the bucketed path's async
#                              all-reduce and find_unused_parameters; backend="auto" with one
#                              rank per GPU; the parameter server on nccl; timing on nccl
#   tests/test_gpu_modules.py  context parallelism (ring, all-gather and Ulysses attention,
#                              causal, both layouts, forward and backward, against sdpa; the
#                              cross-rank argument check); expert parallelism (the MoE layer's
#                              all-to-all dispatch / combine against one process; the MoE load
#                              on nccl); the compression hooks (fp16 / bf16 / PowerSGD against
#                              torch's on DDP and the bucketed wrapper, top-k and sign against
#                              the reference); decentralized training (gossip, D-PSGD and the
#                              other methods against their simulations, bytes against the
#                              formulas; the decentralized parameter server on gloo); the data
#                              pipeline (sharded reader -> DataLoader with pinned memory -> GPU);
#                              one emulated run (asked for nccl: warned, on gloo, training CUDA
#                              tensors bit for bit as real mode)
# A test that needs nccl with one GPU per rank is skipped on a one-GPU machine with a reason
# saying "needs 2 GPUs"; the script lists those at the end of the tests. Without a GPU the
# tests' logic runs on the CPU with DDNB_GPU_TESTS_DEVICE=cpu (pytest tests/test_gpu*.py -m gpu).
#
# Then every notebook top to bottom on this machine (`--nbval-lax`: outputs are not
# compared, since GPU numbers differ from the stored CPU ones, but a cell that raises fails;
# the stored notebooks are not rewritten). Run it on a machine with CUDA, from the repository:
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
report=$(mktemp --suffix=.xml)
status=0
"$PY" -m pytest tests -m gpu -rs -p no:cacheprovider --junitxml="$report" "$@" || status=$?
"$PY" - "$report" <<'PYEOF'
import sys
import xml.etree.ElementTree as ET

try:
    cases = list(ET.parse(sys.argv[1]).getroot().iter("testcase"))
except (OSError, ET.ParseError):
    sys.exit(0)
short = [f"{c.get('classname', '').replace('.', '/')}.py::{c.get('name')}" for c in cases
         for s in c.findall("skipped") if "needs 2 GPUs" in (s.get("message") or "")]
if short:
    print(f"\n{len(short)} test(s) skipped for lack of a second GPU (nccl needs one GPU per rank):")
    print("\n".join(f"  {name}" for name in short))
else:
    print("\nno test was skipped for lack of a second GPU")
PYEOF
rm -f "$report"
[ "$status" -eq 0 ] || exit "$status"
# after the tests' worlds are gone, as `make test` does; NOTEBOOKS="notebooks/00_getting_started.ipynb ..."
# picks fewer (the arguments above are pytest's for the tests only)
exec "$PY" -m pytest ${NOTEBOOKS:-notebooks} --nbval-lax --nbval-current-env -p no:cacheprovider --durations=15
