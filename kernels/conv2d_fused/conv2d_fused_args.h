// Plain description of one fused conv2d launch, shared by the torch op, the generated
// kernel instances and the C++ tests.  No torch and no CUTLASS types here, so that the
// instances compile without torch headers and the tests without the op library.
#pragma once

namespace cutlass_ops {
namespace conv2d_fused {

enum class DType { kF16, kBF16 };

// y[n,p,q,k] = act(scale * sum_{r,s,c} x[n,h,w,c] * w[k,r,s,c] + bias + residual) + post_bias
// All tensors NHWC (the weight KRSC), densely packed.  Pointers that are null take the
// neutral value: scale 1, bias 0, post_bias 0, no residual.
struct Conv2dFusedArgs {
  DType dtype;
  int N, H, W, C;        // input
  int K, R, S;           // weight
  int P, Q;              // output
  int pad_h, pad_w, stride_h, stride_w;
  void const* input;
  void const* weight;
  void const* residual;          // [N,P,Q,K] in dtype, or null
  void* output;                  // [N,P,Q,K] in dtype
  float const* bias;             // [K] float32 per-channel bias, or null
  float const* bias_scalar;      // device scalar added to every element, or null
  float const* scale;            // device scalar, or null (1)
  float const* post_bias;        // device scalar, or null (0)
  bool relu;
  // Set by the dispatcher: serial split-K over the GEMM K dimension (R*S*C) when the
  // output alone gives too few threadblocks.  The workspace holds its semaphores.
  int split_k_slices = 1;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // Launch as a programmatic dependent of the previous kernel (sm90+, see
  // common/programmatic_launch.cuh); the caller decides.
  bool programmatic_launch = false;
  // On sm90: try the Hopper-native (family 90) kernels before the family-80 ones; the caller
  // decides (CUTLASS_OPS_SM90=1 opts in until they are tested and timed on a GPU).
  bool sm90_kernels = false;
};

}  // namespace conv2d_fused
}  // namespace cutlass_ops
