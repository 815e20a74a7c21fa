# se_gate's hand-written sources (cutlass_ops_family: cmake/Families.cmake).
cutlass_ops_family(se_gate
  OP se_gate_op.cpp
  CUDA se_gate_cuda.cpp
  KERNELS se_gate_kernel.cu se_gate_backward_kernel.cu)
