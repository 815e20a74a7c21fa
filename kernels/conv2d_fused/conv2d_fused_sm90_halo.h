// Hand-written Hopper (sm_90a) kernels for one conv problem class: 3x3, stride 1, pad 1,
// C = K = 64, 16-wide maps (FusedResNet's block 0 at 64x64 inputs), fp16/bf16.  They read each
// input tile once with its halo instead of nine times through im2col (design and measurements:
// docs/experiments/sm90_halo_conv; the shared code: conv2d_fused_sm90_halo.cuh).  Built with the
// family-90 kernels.
//   - conv2d_fused's epilogue (no residual): the dispatcher tries it before the generated
//     kernels (see launch()), and conv2d_dgrad runs block 0's dgrad through it
//     (conv2d_backward_cuda.cpp: dgrad_by_halo).
//   - se_gate as the epilogue (conv2d_fused_se_gate, 16 x 16 maps): run_halo_se_gate().
#pragma once

#include <cuda_runtime.h>

#include "conv2d_fused/conv2d_fused_dispatch.h"

namespace cutlass_ops {
namespace conv2d_fused {

// The halo kernels of this build (fp16, bf16); an empty list when it has no family 90.
extern const KernelEntry kHaloKernels[];
extern const int kNumHaloKernels;

// One conv2d_fused_se_gate launch (cutlass_ops/ops/conv2d_fused.py):
//   h      = scale * conv3x3(input, weight) + h_bias
//   out    = relu(h * sigmoid(W2 relu(W1 mean_hw(h) + b1) + b2) + identity + identity_bias) + post_bias
//   pooled = avg_pool2d(out, 3, 2, 1, count_include_pad)      (when pooled is not null)
// Maps NHWC in dtype, densely packed, 16-byte aligned; the weight KRSC; the excite weights and
// the scalars float32 (scalars: device pointers, null for the neutral value).
struct HaloSeGateArgs {
  DType dtype;
  int N, H, W, C, K;
  int R;                       // the excite's hidden width
  void const* input;           // [N, H, W, C]
  void const* weight;          // [K, 3, 3, C]
  void const* identity;        // [N, H, W, K]
  void* output;                // [N, H, W, K]
  void* pooled;                // [N, H/2, W/2, K], or null
  float const* scale;
  float const* h_bias;
  float const* identity_bias;
  float const* post_bias;
  float const* w1;             // (R, K)
  float const* b1;             // (R)
  float const* w2;             // (K, R)
  float const* b2;             // (K)
  bool programmatic_launch = false;
};

// Whether the kernel takes the problem: 16 x 16 maps, C = K = 64, 1 <= R <= 16, N >= 1, the
// maps 16-byte aligned.  (Whether this build has the kernel: run_halo_se_gate.)
inline bool halo_se_gate_fits(HaloSeGateArgs const& a) {
  auto aligned = [](void const* p) { return reinterpret_cast<unsigned long long>(p) % 16 == 0; };
  return a.H == 16 && a.W == 16 && a.C == 64 && a.K == 64 && a.R >= 1 && a.R <= 16 && a.N >= 1 &&
         aligned(a.input) && aligned(a.weight) && aligned(a.identity) && aligned(a.output) &&
         (a.pooled == nullptr || aligned(a.pooled));
}

namespace sm90_halo {
// The kernel (conv2d_fused_sm90_halo_se_gate.cu; in builds with family 90).
cutlass::Status run_se_gate(HaloSeGateArgs const& a, cudaStream_t stream);
}  // namespace sm90_halo

}  // namespace conv2d_fused
}  // namespace cutlass_ops
