#!/usr/bin/env bash
# Builds sweep_bench with the halo variants and the persistent baseline of block 0's problem, with
# the driver of ../sm90_conv3x_fprop (any machine with nvcc 13 and the nvidia-cutlass wheel;
# no GPU needed), into $B (default /tmp/halo_build).  Then on the GPU:
#   $B/sweep_bench --variant haloT_t128x64_s6_w0,pp_t128x64_s6_tmav --n 2048
#   python3 ../sm90_conv3x_fprop/cudnn_fprop.py     (cuDNN on the same shapes)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
B=${B:-/tmp/halo_build}
PY=${PYTHON:-python3}
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
S=$("$PY" -c "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source'))")
F=(-std=c++17 -O3 -DNDEBUG -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -I"$S/include"
   -I"$S/tools/util/include" -I"$HERE/../sm90_conv3x_fprop" -Xptxas -v)
mkdir -p "$B"
"$NVCC" "${F[@]}" -c -o "$B/sweep_main.o" "$HERE/../sm90_conv3x_fprop/sweep_main.cu"
"$NVCC" "${F[@]}" -DVID=pp_t128x64_s6_tmav -DTM=128 -DTN=64 -DSTAGES=6 -DEPI=1 -DCVOID=1 -DSCHED=2 \
  -c -o "$B/pp.o" "$HERE/../sm90_conv3x_fprop/sweep_variant.cu"
"$NVCC" "${F[@]}" -c -o "$B/halo.o" "$HERE/halo_variant.cu"                          # M = pixels
"$NVCC" "${F[@]}" -c -o "$B/haloT.o" "$HERE/haloT_variant.cu"                        # M = channels
"$NVCC" "${F[@]}" -DHALO_WAIT0=1 -DHALO_VID=haloT_t128x64_s6_w0 -c -o "$B/haloT_w0.o" "$HERE/haloT_variant.cu"
"$NVCC" -gencode arch=compute_90a,code=sm_90a "$B"/sweep_main.o "$B"/pp.o "$B"/halo.o "$B"/haloT.o "$B"/haloT_w0.o \
  -o "$B/sweep_bench"
echo "built $B/sweep_bench"
