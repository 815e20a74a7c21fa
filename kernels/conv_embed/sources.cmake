# conv_embed's hand-written sources (cutlass_ops_family: cmake/Families.cmake).
cutlass_ops_family(conv_embed
  OP conv_embed_op.cpp
  CUDA conv_embed_cuda.cpp
  KERNELS conv_embed_kernel.cu)
