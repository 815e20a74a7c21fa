#include "variants.cuh"
namespace cutlass_ops { namespace conv2d_b2b {
cutlass::Status exp_f16_k64_k128_rf4warps(Conv2dB2bArgs const& a, cudaStream_t s) { return run_b2b<cutlass::half_t, 64, 128, exp_b2b::Rf4Warps>(a, s); }
}}
