# giou's hand-written sources (cutlass_ops_family: cmake/Families.cmake).
cutlass_ops_family(giou
  OP giou_op.cpp
  CUDA giou_cuda.cpp
  KERNELS giou_kernel.cu)
