# dw_conv3x3_tokens's hand-written sources (cutlass_ops_family: cmake/Families.cmake).
cutlass_ops_family(dw_conv3x3_tokens
  OP dw_conv3x3_tokens_op.cpp
  CUDA dw_conv3x3_tokens_cuda.cpp
  KERNELS dw_conv3x3_tokens_kernel.cu)
