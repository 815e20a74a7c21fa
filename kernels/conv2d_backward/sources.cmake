# conv2d_backward's hand-written sources (cutlass_ops_family: cmake/Families.cmake).
# conv2d dgrad/wgrad; instances and dispatch table generated (the op manifest).
cutlass_ops_family(conv2d_backward
  OP conv2d_backward_op.cpp
  CUDA conv2d_backward_cuda.cpp
  KERNELS weight_grad_kernel.cu
  DISPATCH conv2d_backward_dispatch.cpp)
