#include "variants.cuh"
// "shipped": the register-resident tiles that conv2d_b2b_instance.cuh used for K1 = 128 before this experiment.
namespace cutlass_ops { namespace conv2d_b2b {
cutlass::Status exp_f16_k64_k128_shipped(Conv2dB2bArgs const& a, cudaStream_t s) { return run_b2b<cutlass::half_t, 64, 128, B2bTiles<64, 128, false>>(a, s); }
cutlass::Status exp_bf16_k64_k128_shipped(Conv2dB2bArgs const& a, cudaStream_t s) { return run_b2b<cutlass::bfloat16_t, 64, 128, B2bTiles<64, 128, false>>(a, s); }
cutlass::Status exp_f16_k64_k64_shipped(Conv2dB2bArgs const& a, cudaStream_t s) { return run_b2b<cutlass::half_t, 64, 64>(a, s); }
}}
