# scale_samples's hand-written sources (cutlass_ops_family: cmake/Families.cmake).
cutlass_ops_family(scale_samples
  OP scale_samples_op.cpp
  CUDA scale_samples_cuda.cpp
  KERNELS scale_samples_kernel.cu)
