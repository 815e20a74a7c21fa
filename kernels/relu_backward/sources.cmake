# relu_backward's hand-written sources (cutlass_ops_family: cmake/Families.cmake).
cutlass_ops_family(relu_backward
  OP relu_backward_op.cpp
  CUDA relu_backward_cuda.cpp
  KERNELS relu_backward_kernel.cu)
