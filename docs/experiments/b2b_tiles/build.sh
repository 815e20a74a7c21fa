#!/usr/bin/env bash
# Builds ./b2b_tiles (sm_90) from time_tiles.cu.
set -euo pipefail
cd "$(dirname "$0")"
REPO=$(cd ../../.. && pwd)
CUTLASS=${CUTLASS:-$(python3 -c 'import cutlass_library, os; print(os.path.dirname(cutlass_library.__file__))')/source}
nvcc --resource-usage -std=c++17 --expt-relaxed-constexpr -O3 -DNDEBUG -gencode arch=compute_90,code=sm_90 \
  -I"$REPO/kernels" -I"$REPO/tests/cpp" -I"$CUTLASS/include" -I"$CUTLASS/tools/util/include" \
  -I"$CUTLASS/examples/13_two_tensor_op_fusion" time_tiles.cu -o b2b_tiles
