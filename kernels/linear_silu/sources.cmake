# linear_silu's hand-written sources (cutlass_ops_family: cmake/Families.cmake).
# Family-90 GEMMs with a SiLU epilogue; instances and dispatch table generated
# (cutlass_ops_gen/linear_silu.py).
cutlass_ops_family(linear_silu
  OP linear_silu_op.cpp
  CUDA linear_silu_cuda.cpp)
