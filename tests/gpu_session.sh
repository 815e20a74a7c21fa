#!/usr/bin/env bash
# One GPU call that gathers the evidence the FusedResNet issues ask for, within the device
# tool's 10-minute limit: build (all kernels, this GPU's arch, committed profiles) and the
# test command; the gradient table (fp16/bf16 vs float64, beside PyTorch's own); the
# training benchmark; the inference benchmark, one batch size at a time merged into one
# JSON (a batch size takes ~4 min, most of it compiling max-autotune for the NCHW and the
# channels_last model: pass the batch sizes that fit, e.g. BATCHES="128 512" in one call,
# SKIP_TESTS=1 BATCHES="1 32" in the next; carry the JSON over to merge).
#   OUT=dir BATCHES="128" SKIP_TESTS=0 SKIP_TRAIN=0 bash tests/gpu_session.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_results}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
PYTHON=${PYTHON:-python3}
REPO=$PWD
export MAX_JOBS=${MAX_JOBS:-16} CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-16} PYTHONUNBUFFERED=1
# The system compiler: see tests/gpu_acceptance.sh on statically linked libstdc++.
if [ -x /usr/bin/g++ ]; then export CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++ CC=/usr/bin/gcc; fi
ARCH=${ARCH:-$(cd /tmp && "$PYTHON" -P -c 'import torch; print("%d%d" % torch.cuda.get_device_capability())')}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
start=$(date +%s)

if [ "${SKIP_TESTS:-0}" = 1 ]; then
  CUTLASS_OPS_ARCHS=$ARCH "$PYTHON" -m pip install -q --no-build-isolation --no-deps . -Cbuild-dir=build-session \
    > /tmp/gpu_session_build.log 2>&1 || { tail -30 /tmp/gpu_session_build.log; exit 1; }
else
  CUTLASS_OPS_ARCHS=$ARCH BUILD_DIR=build-session PYTHON="$PYTHON" timeout 400 bash tests/run.sh -q > "$OUT/tests.log" 2>&1
  grep -E "passed|failed|build took|^FAILED" "$OUT/tests.log" | tail -12
  (cd /tmp && timeout 90 "$PYTHON" -P -m pytest -q -s -p no:cacheprovider "$REPO/tests/python/test_autograd.py" \
     -k "low_precision and cuda" > "$OUT/grads.txt" 2>&1)
  grep -E "^over|passed|failed" "$OUT/grads.txt"
fi
echo "== ready after $(( $(date +%s) - start )) s"

if [ "${SKIP_TRAIN:-0}" != 1 ]; then
  (cd /tmp && timeout 180 "$PYTHON" -P -m cutlass_ops bench train --out "$OUT/train.json" 2>/dev/null)
fi
for b in ${BATCHES:-128}; do
  (cd /tmp && timeout "${RESNET_TIMEOUT:-300}" "$PYTHON" -P -m cutlass_ops bench resnet --batch "$b" --merge \
     --out "$OUT/resnet.json" 2>/dev/null | grep -v "^ \{5,\}[0-9.]\+ \+_ZN7cutlass") \
    || echo "bench resnet N=$b: stopped (timeout ${RESNET_TIMEOUT:-300} s)"
done
echo "== done in $(( $(date +%s) - start )) s"
