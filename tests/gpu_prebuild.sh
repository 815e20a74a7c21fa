#!/usr/bin/env bash
# Builds, on a machine without a GPU, what tests/gpu_session.sh would otherwise build on the GPU
# machine, into gpu_carry/ (carry it, with FROM_WHEEL=1): the cutlass_ops wheel for the GPU's arch
# (every kernel; about 25 minutes on 2 cores) and block 0's experiment extension for sm_90a
# (docs/experiments/block0_fused/run.py --build-only; about 2 minutes).  Needs nvcc and a Python
# with the torch the GPU machine runs (2.11.0+cu130), scikit-build-core, cmake, ninja and
# nvidia-cutlass.  The wheel is for any Python 3 (the stable ABI); the extension only for this
# Python's version (the GPU machine runs 3.12: built under another, run.py compiles it there).
#   PYTHON=/tmp/venv/bin/python bash tests/gpu_prebuild.sh          # arch 90 (H100/H200)
#   ARCHS=90 PYTHON=... bash tests/gpu_prebuild.sh 2>&1 | tail -3
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
ARCHS=${ARCHS:-90}
# the venv's own tools (cmake, ninja) where PYTHON names a venv's python
case $PYTHON in */*) PATH="$(dirname "$PYTHON"):$PATH" ;; esac
export PATH="/usr/local/cuda/bin:$PATH" CUDACXX=${CUDACXX:-/usr/local/cuda/bin/nvcc}
mkdir -p gpu_carry
rm -f gpu_carry/cutlass_ops-*.whl gpu_carry/block0_fused_ext.so
start=$SECONDS
echo "gpu_prebuild: the wheel (archs $ARCHS, all kernels, $("$PYTHON" -c 'import torch; print("torch", torch.__version__)')); log in gpu_carry/wheel_build.log"
CUTLASS_OPS_ARCHS=$ARCHS MAX_JOBS=${MAX_JOBS:-$(nproc)} "$PYTHON" -m pip wheel -v --no-build-isolation --no-deps . \
  -w gpu_carry -Cbuild-dir=build-prebuild > gpu_carry/wheel_build.log 2>&1 \
  || { tail -30 gpu_carry/wheel_build.log; exit 1; }
echo "gpu_prebuild: $(ls gpu_carry/cutlass_ops-*.whl) in $((SECONDS - start)) s"
start=$SECONDS
"$PYTHON" docs/experiments/block0_fused/run.py --build-only build-prebuild/block0_ext > gpu_carry/block0_build.log 2>&1 \
  || { tail -30 gpu_carry/block0_build.log; exit 1; }
cp build-prebuild/block0_ext/block0_fused_ext.so gpu_carry/
echo "gpu_prebuild: gpu_carry/block0_fused_ext.so in $((SECONDS - start)) s"
echo "gpu_prebuild: now carry [\".whl\", \"gpu_carry\"] and run FROM_WHEEL=1 ... bash tests/gpu_session.sh"
