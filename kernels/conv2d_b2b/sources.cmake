# conv2d_b2b's hand-written sources (cutlass_ops_family: cmake/Families.cmake).
# Back-to-back convs; instances generated (cutlass_ops_gen/b2b.py), compiled with the family-80
# flags and CUTLASS's B2B templates, which live in the wheel's examples/13_two_tensor_op_fusion.
cutlass_ops_family(conv2d_b2b
  OP conv2d_b2b_op.cpp
  CUDA conv2d_b2b_cuda.cpp
  INCLUDES "${CUTLASS_LIBRARY_DIR}/source/examples/13_two_tensor_op_fusion")
