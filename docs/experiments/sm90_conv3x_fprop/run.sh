# CUTLASS 3.x sm90 (TMA + wgmma, warp-specialized) conv fprop vs cuDNN on FusedResNet's
# forward convs, on a Hopper GPU; needs nvidia-cutlass (its headers) importable.
# Usage: bash docs/experiments/sm90_conv3x_fprop/run.sh > results.txt
set -euo pipefail
cd "$(dirname "$0")"
S=$(python3 -c "import cutlass_library, os; print(os.path.dirname(cutlass_library.__file__))")/source
for cfg in "128 64 64 1" "128 64 64 2" "64 64 64 1" "128 128 64 1" "64 128 64 1" "128 128 64 2" "64 256 64 1" "128 64 128 1"; do
  set -- $cfg
  nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -I"$S/include" \
    -I"$S/tools/util/include" -DTM=$1 -DTN=$2 -DTK=$3 -DCM=$4 conv3x_fprop.cu -o /tmp/conv3x_$1_$2_$3_$4 &
done
wait
for f in /tmp/conv3x_*; do "$f"; done
python3 cudnn_fprop.py
