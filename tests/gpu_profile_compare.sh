#!/usr/bin/env bash
# Profile this GPU and measure what the profile buys (README: Profiles):
#   1. build the sweep kernel set with the tests and run them all (tests/run.sh), then sweep
#      FusedResNet's conv problems into $OUT/<gpu>/sm80.csv (python -m cutlass_ops profile),
#      and its training convs' dgrad/wgrad against cuDNN's (profile --backward, same CSV);
#   2. build with default tiles, benchmark FusedResNet (N=128, 2048);
#   3. build with that profile in profiles/, benchmark again.
# Commit the CSV to profiles/<gpu>/ to make every later build use it.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_results}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
PYTHON=${PYTHON:-python3}
ARCH=${ARCH:-$(cd /tmp && "$PYTHON" -P -c 'import torch; print("%d%d" % torch.cuda.get_device_capability())')}
export MAX_JOBS=${MAX_JOBS:-16} CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-16}
if [ -x /usr/bin/g++ ]; then export CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++ CC=/usr/bin/gcc; fi

build() {  # kernel set, profiles folder
  CUTLASS_OPS_ARCHS=$ARCH CUTLASS_OPS_KERNELS=$1 "$PYTHON" -m pip install -q --no-build-isolation \
    --no-deps . -Cbuild-dir="build-$1-$(basename "$2")" -Ccmake.define.CUTLASS_OPS_PROFILES="$2" \
    > "/tmp/build-$1.log" 2>&1 || { tail -40 "/tmp/build-$1.log"; exit 1; }
  grep -o "cutlass_ops_gen: .*" "/tmp/build-$1.log" || true
}

echo "== 1. sweep build, all tests, profile"
CUTLASS_OPS_ARCHS=$ARCH CUTLASS_OPS_KERNELS=sweep BUILD_DIR=build-sweep PYTHON="$PYTHON" \
  bash tests/run.sh -q > "$OUT/tests.log" 2>&1 || true
grep -E "passed|failed|rror" "$OUT/tests.log" | tail -6
gpu=$(cd /tmp && "$PYTHON" -P -c 'import torch; from cutlass_ops.tools.profiler import gpu_slug; print(gpu_slug(torch.cuda.get_device_name()))')
# Resumable: a sweep cut by the timeout leaves its rows; run the script again to finish it.
(cd /tmp && timeout "${PROFILE_TIMEOUT:-420}" "$PYTHON" -P -m cutlass_ops profile --profiles "$OUT" 2>&1 \
   | grep -v "^  \[" | tail -5) || echo "profile: stopped by the ${PROFILE_TIMEOUT:-420} s timeout"
(cd /tmp && timeout "${PROFILE_TIMEOUT:-420}" "$PYTHON" -P -m cutlass_ops profile --backward --batch 512 2048 \
   --profiles "$OUT" 2>&1 | grep -v "^  \[" | tail -5) || echo "profile --backward: stopped by the timeout"

echo "== 2. default tiles"
build all "$(mktemp -d)"
(cd /tmp && "$PYTHON" -P -m cutlass_ops bench resnet --batch 128 2048 --systems FusedResNet "FusedResNet graph=True" \
   --out "$OUT/resnet_default.json" 2>/dev/null)
(cd /tmp && "$PYTHON" -P -m cutlass_ops layers --batch 128 2048 > "$OUT/layers_default.txt")

echo "== 3. profile-selected tiles"
profiles=$(mktemp -d); mkdir -p "$profiles/$gpu"; cp "$OUT/$gpu/sm80.csv" "$profiles/$gpu/"
build all "$profiles"
grep -h "profile" build-all-*/generated/*.cu | sort | uniq -c | head -3 || true
(cd /tmp && "$PYTHON" -P -m cutlass_ops bench resnet --batch 128 2048 --systems FusedResNet "FusedResNet graph=True" \
   --out "$OUT/resnet_profiled.json" 2>/dev/null)
(cd /tmp && "$PYTHON" -P -m cutlass_ops layers --batch 128 2048 | tee "$OUT/layers_profiled.txt")
