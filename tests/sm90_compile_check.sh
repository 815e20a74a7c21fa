#!/usr/bin/env bash
# Compile-only check of the Hopper-native (family 90: CUTLASS 3.x, TMA + wgmma, sm_90a)
# conv2d_fused instances, with the CUDA 13 toolkit the build uses: generates the instance set
# (default: the `ci` set, one fp16 kernel; SM90_KERNELS=all for every default tile), compiles
# each for sm_90a exactly as CMake does, and prints its compile time and ptxas's register and
# spill counts.  Nothing runs; no GPU needed.  Fails when an instance does not compile.
#   usage: PYTHON=/path/to/python tests/sm90_compile_check.sh
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# Any Python with the nvidia-cutlass wheel (for its headers and the generator's emitter).
PYTHON=${PYTHON:-python3}
NVCC=${CUDACXX:-/usr/local/cuda/bin/nvcc}
KERNELS=${SM90_KERNELS:-ci}
"$NVCC" --version | grep release

CUTLASS=$("$PYTHON" -c 'import cutlass_library,os;print(os.path.dirname(cutlass_library.__file__))')/source
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
PYTHONPATH="$REPO/python${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m cutlass_ops_gen --archs 90 --kernels "$KERNELS" --out "$OUT/gen" \
  > "$OUT/gen.log" 2>&1 || { cat "$OUT/gen.log" >&2; exit 1; }
tail -n 1 "$OUT/gen.log"

shopt -s nullglob
passed=0 failed=0
for cu in "$OUT"/gen/*_sm90_*.cu; do
  name=$(basename "$cu" .cu)
  start=$SECONDS
  # The flags of CMakeLists.txt's family-90 object library (cmake/CudaArchs.cmake).
  if "$NVCC" -std=c++17 -O3 --expt-relaxed-constexpr -DNDEBUG -gencode=arch=compute_90a,code=sm_90a \
       -Xptxas -v -I"$CUTLASS/include" -I"$CUTLASS/tools/util/include" -I"$REPO/kernels" \
       -c "$cu" -o "$OUT/$name.o" > "$OUT/$name.log" 2>&1; then
    usage=$(grep -A3 "Compiling entry function '.*conv2d_fused_sm90_kernel" "$OUT/$name.log" |
            grep -E -o "[0-9]+ bytes spill stores|Used [0-9]+ registers" | paste -sd, - || true)
    echo "ok   $name ($((SECONDS - start)) s; $usage)"; passed=$((passed + 1))
  else
    echo "FAIL $name ($((SECONDS - start)) s)"; failed=$((failed + 1))
    head -c 4000 "$OUT/$name.log"   # the first errors are the useful ones
  fi
done
# A generator that emits no Sm90 instance would otherwise "pass".
[ $((passed + failed)) -gt 0 ] || { echo "error: no *_sm90_*.cu emitted" >&2; failed=1; }
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
