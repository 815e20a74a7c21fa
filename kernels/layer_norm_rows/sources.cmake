# layer_norm_rows's hand-written sources (cutlass_ops_family: cmake/Families.cmake).
cutlass_ops_family(layer_norm_rows
  OP layer_norm_rows_op.cpp
  CUDA layer_norm_rows_cuda.cpp
  KERNELS layer_norm_rows_kernel.cu)
