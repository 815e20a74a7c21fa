// The shipped tiles with half accumulators, as CUTLASS's fused_two_convs_f16_sm80_rf.cu.
#include "variants.cuh"
namespace cutlass_ops { namespace conv2d_b2b {
cutlass::Status exp_f16_k64_k128_halfacc(Conv2dB2bArgs const& a, cudaStream_t s) { return run_b2b<cutlass::half_t, 64, 128, B2bTiles<64, 128, false>, cutlass::half_t>(a, s); }
}}
