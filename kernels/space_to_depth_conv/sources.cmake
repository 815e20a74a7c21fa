# space_to_depth_conv's hand-written sources (cutlass_ops_family: cmake/Families.cmake).
cutlass_ops_family(space_to_depth_conv
  OP space_to_depth_conv_op.cpp
  CUDA space_to_depth_conv_cuda.cpp
  KERNELS space_to_depth_conv_kernel.cu space_to_depth_conv_backward_kernel.cu)
