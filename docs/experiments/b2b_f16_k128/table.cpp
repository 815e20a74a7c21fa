// The experiment's table: tests/cpp/test_conv2d_b2b_kernel.cu's main runs every row.
#include "conv2d_b2b/conv2d_b2b_args.h"
namespace cutlass_ops { namespace conv2d_b2b {
#define V(name) cutlass::Status name(Conv2dB2bArgs const&, cudaStream_t);
V(exp_f16_k64_k128_shipped) V(exp_bf16_k64_k128_shipped) V(exp_f16_k64_k64_shipped) V(exp_f16_k64_k128_ptx80)
V(exp_f16_k64_k128_halfacc) V(exp_f16_k64_k128_rf4warps) V(exp_f16_k64_k128_smem) V(exp_bf16_k64_k128_smem)
const KernelEntry kKernels[] = {
  {"f16 64->128 shipped (RF, 2 warps, sm_90 SASS)", DType::kF16, 64, 128, &exp_f16_k64_k128_shipped},
  {"bf16 64->128 shipped (RF, 2 warps)", DType::kBF16, 64, 128, &exp_bf16_k64_k128_shipped},
  {"f16 64->64 shipped (RF, 2 warps)", DType::kF16, 64, 64, &exp_f16_k64_k64_shipped},
  {"f16 64->128 shipped, compute_80 PTX JIT", DType::kF16, 64, 128, &exp_f16_k64_k128_ptx80},
  {"f16 64->128 RF, half accumulators", DType::kF16, 64, 128, &exp_f16_k64_k128_halfacc},
  {"f16 64->128 RF, 4 warps (128 rows)", DType::kF16, 64, 128, &exp_f16_k64_k128_rf4warps},
  {"f16 64->128 smem-resident, 4 warps", DType::kF16, 64, 128, &exp_f16_k64_k128_smem},
  {"bf16 64->128 smem-resident, 4 warps", DType::kBF16, 64, 128, &exp_bf16_k64_k128_smem},
};
const int kNumKernels = 8;
}}
