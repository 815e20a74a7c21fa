// The shipped f16 64 -> 128 instance, compiled to compute_80 PTX only (the driver JITs it).
#include "variants.cuh"
namespace cutlass_ops { namespace conv2d_b2b {
cutlass::Status exp_f16_k64_k128_ptx80(Conv2dB2bArgs const& a, cudaStream_t s) { return run_b2b<cutlass::half_t, 64, 128, B2bTiles<64, 128, false>>(a, s); }
}}
