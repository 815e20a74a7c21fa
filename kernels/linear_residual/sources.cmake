# linear_residual's hand-written sources (cutlass_ops_family: cmake/Families.cmake).
# cuBLASLt GEMM with the residual add in its epilogue: no kernels of its own.
cutlass_ops_family(linear_residual
  OP linear_residual_op.cpp
  CUDA linear_residual_cuda.cpp)
