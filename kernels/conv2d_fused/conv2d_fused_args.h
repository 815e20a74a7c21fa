// Plain description of one fused conv2d launch, shared by the torch op, the generated
// kernel instances and the C++ tests.  No torch and no CUTLASS types here, so that the
// instances compile without torch headers and the tests without the op library.
#pragma once

namespace cutlass_ops {
namespace conv2d_fused {

enum class DType { kF16, kBF16 };

// When the automatic choice on an sm90 GPU tries the Hopper-native (family 90) kernels; a
// forced kernel (the tests, the profiler) runs regardless.
enum class Sm90Policy {
  kNever,     // family 80 only
  kProfiled,  // family 90 where the profile rule of family 90 (profiles/<gpu>/sm90.csv) is
              // faster than family 80's for the problem; family 80 where no sm90 rule covers it
  kFirst,     // family 90 first wherever it can run (to test and time it)
};

// The epilogue's activation.  SiLU v * sigmoid(v) (float32, as torch's): FusedCvT's
// QuickGELU MLPs with the 1.702 as scale (cutlass_ops/fused_cvt.py).
enum class Activation { kIdentity = 0, kRelu = 1, kSilu = 2 };

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
  Activation act = Activation::kIdentity;
  // Set by the dispatcher: serial split-K over the GEMM K dimension (R*S*C) when the
  // output alone gives too few threadblocks.  The workspace holds its semaphores.
  int split_k_slices = 1;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // Launch as a programmatic dependent of the previous kernel (sm90+, see
  // common/programmatic_launch.cuh); the caller decides.
  bool programmatic_launch = false;
  // On sm90: when to try the Hopper-native (family 90) kernels before the family-80 ones;
  // the caller decides (CUTLASS_OPS_SM90, conv2d_fused_cuda.cpp).
  Sm90Policy sm90_policy = Sm90Policy::kNever;
};

}  // namespace conv2d_fused
}  // namespace cutlass_ops
