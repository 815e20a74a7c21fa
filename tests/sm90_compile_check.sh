#!/usr/bin/env bash
# Compile-only check of the Hopper-native (family 90: CUTLASS 3.x, TMA + wgmma, sm_90a)
# conv2d_fused and linear_silu instances, with the CUDA 13 toolkit the build uses: generates the instance set
# (default: the `ci` set, one stock and one persistent fp16 conv kernel and a linear_silu kernel
# per dtype; SM90_KERNELS=all for every default tile), compiles
# each for sm_90a exactly as CMake does, and prints its compile time and ptxas's register and
# spill counts, and the kernel's dynamic shared memory (Kernel::SharedStorageSize, printed by a
# deprecation warning).  Nothing runs; no GPU needed.  Fails when an instance does not compile,
# spills, draws a ptxas C75xx warning (wgmma serialized), or, for a stock (not persistent)
# conv2d_fused kernel, needs so many registers that fewer CTAs fit an SM than its shared memory
# allows (an epilogue's SiLU branch took 128x64x64_4s from 95 to 133 registers, from two CTAs
# per SM to one, and FusedResNet's family-90 convs 1.4-1.7x longer, unnoticed until
# timed).
#   usage: PYTHON=/path/to/python tests/sm90_compile_check.sh
#   SM90_ONLY=REGEX compiles only the instances whose name matches (e.g. SM90_ONLY='_coop_|_pp_'
#   for the persistent ones); JOBS=N compiles N at a time (default 1).
#   SM90_BACKWARD=1 generates with --sm90-backward, adding the family-90 conv2d_dgrad/conv2d_wgrad
#   instances (e.g. SM90_BACKWARD=1 SM90_ONLY='dgrad|wgrad' for those alone).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# Any Python with the nvidia-cutlass wheel (for its headers and the generator's emitter).
PYTHON=${PYTHON:-python3}
NVCC=${CUDACXX:-/usr/local/cuda/bin/nvcc}
KERNELS=${SM90_KERNELS:-ci}
ONLY=${SM90_ONLY:-}
JOBS=${JOBS:-1}
GEN_FLAGS=()
[ "${SM90_BACKWARD:-0}" = 1 ] && GEN_FLAGS+=(--sm90-backward)
"$NVCC" --version | grep release

CUTLASS=$("$PYTHON" -c 'import cutlass_library,os;print(os.path.dirname(cutlass_library.__file__))')/source
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
PYTHONPATH="$REPO/python${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m cutlass_ops_gen --archs 90 --kernels "$KERNELS" ${GEN_FLAGS[@]+"${GEN_FLAGS[@]}"} --out "$OUT/gen" \
  > "$OUT/gen.log" 2>&1 || { cat "$OUT/gen.log" >&2; exit 1; }
tail -n 1 "$OUT/gen.log"

shopt -s nullglob
# Whether a stock family-90 conv kernel (256 threads: a producer and a consumer warp group)
# fits fewer CTAs per SM by its registers (64K a SM, allocated in 8s a thread) than by its
# shared memory (227 KB a SM, 1 KB of it reserved per CTA), up to the two that hide one CTA's
# epilogue behind the other's mainloop.
fewer_ctas_by_registers() {
  local regs smem=${2:-0} by_regs by_smem
  regs=$(echo "$1" | grep -o "Used [0-9]*" | grep -o "[0-9]*") || return 1
  by_regs=$(( 65536 / (((regs + 7) / 8 * 8) * 256) ))
  by_smem=$(( 232448 / (smem + 1024) ))
  [ "$by_smem" -gt 2 ] && by_smem=2
  [ "$by_regs" -lt "$by_smem" ]
}
compile() {  # one instance: writes $OUT/$name.result (first line ok/FAIL) and $OUT/$name.log
  local cu=$1 name start usage smem ns entry
  name=$(basename "$cu" .cu)
  start=$SECONDS
  # conv2d_fused instances launch conv2d_fused_sm90_kernel; dgrad/wgrad and linear_silu
  # cutlass::device_kernel; linear_silu names its configuration <name>_config.
  local config=_base
  case "$name" in
    cutlass_ops_conv2d_dgrad_*|cutlass_ops_conv2d_wgrad_*) ns=conv2d_backward entry="device_kernel" ;;
    cutlass_ops_linear_silu_*) ns=linear_silu entry="device_kernel" config=_config ;;
    *) ns=conv2d_fused entry="conv2d_fused_sm90_kernel" ;;
  esac
  # The instance plus a deprecated function template instantiated with the kernel's shared
  # memory size: its warning prints the number (the object code is the instance's).
  {
    echo "#include \"$cu\""
    echo "template <int N> [[deprecated]] constexpr int smem_bytes() { return N; }"
    echo "static int const kSmemBytes ="
    echo "    smem_bytes<cutlass_ops::${ns}::${name}${config}::Kernel::SharedStorageSize>();"
  } > "$OUT/$name.check.cu"
  # The flags of CMakeLists.txt's family-90 object library (cmake/CudaArchs.cmake).
  if "$NVCC" -std=c++17 -O3 --expt-relaxed-constexpr -DNDEBUG -gencode=arch=compute_90a,code=sm_90a \
       -Xptxas -v -I"$CUTLASS/include" -I"$CUTLASS/tools/util/include" -I"$REPO/kernels" \
       -c "$OUT/$name.check.cu" -o "$OUT/$name.o" > "$OUT/$name.log" 2>&1; then
    usage=$(grep -A3 "Compiling entry function '.*$entry" "$OUT/$name.log" |
            grep -E -o "[0-9]+ bytes spill stores|Used [0-9]+ registers" | paste -sd, - || true)
    smem=$(grep -o "with int N = [0-9]*" "$OUT/$name.log" | head -1 | grep -o "[0-9][0-9]*$" || true)
    if grep -q "C75[0-9][0-9]" "$OUT/$name.log"; then
      echo "FAIL $name ($((SECONDS - start)) s; $usage; smem $smem B): ptxas $(grep -o 'C75[0-9][0-9]' "$OUT/$name.log" | head -1)"
    elif grep -q -E "(^|,)[1-9][0-9]* bytes spill stores" <<< "$usage"; then
      echo "FAIL $name ($((SECONDS - start)) s; $usage; smem $smem B): spills"
    elif [[ $ns == conv2d_fused && ! $name =~ _coop_|_pp_ ]] && fewer_ctas_by_registers "$usage" "$smem"; then
      echo "FAIL $name ($((SECONDS - start)) s; $usage; smem $smem B): its registers leave fewer CTAs per SM than its shared memory does"
    else
      echo "ok   $name ($((SECONDS - start)) s; $usage; smem $smem B)"
    fi > "$OUT/$name.result"
  else
    { echo "FAIL $name ($((SECONDS - start)) s)"; head -c 4000 "$OUT/$name.log"; } > "$OUT/$name.result"
  fi
}
cus=()
for cu in "$OUT"/gen/*_sm90_*.cu; do
  [ -z "$ONLY" ] || [[ $(basename "$cu") =~ $ONLY ]] || continue
  cus+=("$cu")
done
running=0
for cu in ${cus[@]+"${cus[@]}"}; do
  compile "$cu" &
  running=$((running + 1))
  if [ "$running" -ge "$JOBS" ]; then wait -n || true; running=$((running - 1)); fi
done
wait
passed=0 failed=0
for cu in ${cus[@]+"${cus[@]}"}; do
  cat "$OUT/$(basename "$cu" .cu).result"   # a failure's first errors are the useful ones
  if grep -q "^ok" <<< "$(head -n 1 "$OUT/$(basename "$cu" .cu).result")"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
  fi
done
# The hand-written family-90 conv (persistent, one CTA per SM by its shared memory): it must
# compile for sm_90a without spills or a ptxas C75xx warning.
halo=$REPO/kernels/conv2d_fused/conv2d_fused_sm90_halo.cu
if [ -z "$ONLY" ] || [[ $(basename "$halo") =~ $ONLY ]]; then
  start=$SECONDS
  if "$NVCC" -std=c++17 -O3 --expt-relaxed-constexpr -DNDEBUG -gencode=arch=compute_90a,code=sm_90a \
       -Xptxas -v -I"$CUTLASS/include" -I"$CUTLASS/tools/util/include" -I"$REPO/kernels" \
       -c "$halo" -o "$OUT/halo.o" > "$OUT/halo.log" 2>&1; then
    usage=$(grep -A3 "Compiling entry function '.*halo_conv_kernel" "$OUT/halo.log" |
            grep -E -o "[0-9]+ bytes spill stores|Used [0-9]+ registers" | paste -sd, - || true)
    if grep -q "C75[0-9][0-9]" "$OUT/halo.log" || grep -q -E "(^|,)[1-9][0-9]* bytes spill stores" <<< "$usage"; then
      echo "FAIL conv2d_fused_sm90_halo ($((SECONDS - start)) s; $usage): spills or ptxas $(grep -o 'C75[0-9][0-9]' "$OUT/halo.log" | head -1)"
      failed=$((failed + 1))
    else
      echo "ok   conv2d_fused_sm90_halo ($((SECONDS - start)) s; $usage)"
      passed=$((passed + 1))
    fi
  else
    echo "FAIL conv2d_fused_sm90_halo ($((SECONDS - start)) s)"; head -c 4000 "$OUT/halo.log"
    failed=$((failed + 1))
  fi
fi
# A generator that emits no Sm90 instance would otherwise "pass".
[ $((passed + failed)) -gt 0 ] || { echo "error: no *_sm90_*.cu emitted" >&2; failed=1; }
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
