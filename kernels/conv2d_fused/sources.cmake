# conv2d_fused's hand-written sources (cutlass_ops_family: cmake/Families.cmake).
# conv2d fprop with the fused epilogue; instances and dispatch table generated (the op
# manifest).  The hand-written family-90 halo conv builds with the generated family-90
# instances; the dispatcher lists it when present.
cutlass_ops_family(conv2d_fused
  OP conv2d_fused_op.cpp
  CUDA conv2d_fused_cuda.cpp
  DISPATCH conv2d_fused_dispatch.cpp
  SM90 conv2d_fused_sm90_halo.cu conv2d_fused_sm90_halo_se_gate.cu
  SM90_DISPATCH_DEFINES CUTLASS_OPS_HAVE_SM90_HALO=1)
