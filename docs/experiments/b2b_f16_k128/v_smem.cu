#include "variants.cuh"
namespace cutlass_ops { namespace conv2d_b2b {
cutlass::Status exp_f16_k64_k128_smem(Conv2dB2bArgs const& a, cudaStream_t s) { return run_b2b<cutlass::half_t, 64, 128, exp_b2b::Smem128>(a, s); }
cutlass::Status exp_bf16_k64_k128_smem(Conv2dB2bArgs const& a, cudaStream_t s) { return run_b2b<cutlass::bfloat16_t, 64, 128, exp_b2b::Smem128>(a, s); }
}}
