#!/usr/bin/env bash
# Builds ./b2b_exp (runs on an sm_90 GPU) from the variants and tests/cpp/test_conv2d_b2b_kernel.cu.
set -euo pipefail
cd "$(dirname "$0")"
REPO=$(cd ../../.. && pwd)
CUTLASS=${CUTLASS:-$(python3 -c 'import cutlass_library, os; print(os.path.dirname(cutlass_library.__file__))')/source}
INC="-I. -I$REPO/kernels -I$REPO/tests/cpp -I$CUTLASS/include -I$CUTLASS/tools/util/include -I$CUTLASS/examples/13_two_tensor_op_fusion"
FLAGS="--resource-usage -std=c++17 --expt-relaxed-constexpr -O3 -DNDEBUG $INC"
SM90="-gencode arch=compute_90,code=sm_90"
mkdir -p obj
nvcc $FLAGS $SM90 -c v_shipped.cu -o obj/v_shipped.o &
nvcc $FLAGS -gencode arch=compute_80,code=compute_80 -c v_ptx.cu -o obj/v_ptx.o &
wait
nvcc $FLAGS $SM90 -c v_half_acc.cu -o obj/v_half_acc.o &
nvcc $FLAGS $SM90 -c v_rf4.cu -o obj/v_rf4.o &
wait
nvcc $FLAGS $SM90 -c v_smem.cu -o obj/v_smem.o &
nvcc $FLAGS $SM90 -c table.cpp -o obj/table.o &
wait
nvcc $FLAGS $SM90 -c "$REPO/tests/cpp/test_conv2d_b2b_kernel.cu" -o obj/main.o
nvcc $SM90 obj/*.o -o b2b_exp
