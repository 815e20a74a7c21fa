// Squeeze-excitation gate with the residual join, one CTA per image or per small group of
// consecutive images (se_gate_images_per_cta):
//   h  += h_bias                                 (optional scalar: a FixUp bias after the conv)
//   s   = mean_hw(h[n])                          (squeeze)
//   g   = sigmoid(W2 relu(W1 s + b1) + b2)       (excite: the two Linear layers)
//   out = relu(h * g + identity + identity_bias) + post_bias
//   pooled = avg_pool2d(out, 3, stride 2, pad 1, count_include_pad)   (optional)
// It also runs as the two ends of the same gate split around an excite MLP of the caller's
// (ops se_squeeze and se_gate_apply): with `means_out` it stops after the squeeze and writes
// s; with `gate_in` it skips the squeeze and the excite and reads g.
// h, identity, out, pooled: NHWC (channels_last) fp16/bf16; W1 (R, C), W2 (C, R), biases
// float32.  The pooled map is the next block's downsample input: the CTA that wrote an
// image's `out` pools it while it is still in L1/L2, so no separate pooling pass.
// No torch here: the op entry point (se_gate_cuda.cpp) calls launch_se_gate.
#pragma once

#include <cuda_runtime.h>

namespace cutlass_ops {
namespace se_gate {

enum class DType { kF16, kBF16 };

struct SeGateArgs {
  DType dtype;
  int N, H, W, C, R;             // R = C / reduction (hidden width of the excite MLP)
  void const* h;
  void const* identity;
  void* out;
  void* pooled;                      // [N, (H+1)/2, (W+1)/2, C], or null: no pooling
  float const* w1; float const* b1;  // (R, C), (R); W1 16-byte aligned
  float const* w2; float const* b2;  // (C, R), (C); W2 16-byte aligned
  float const* identity_bias;        // device scalar or null
  float const* post_bias;            // device scalar or null
  float const* h_bias;               // device scalar or null: added to h first
  void* means_out;                   // [N, C] in h's dtype, or null: write s and stop there
  void const* gate_in;               // [N, C] in h's dtype, or null: read g, no squeeze/excite
  bool stage_w2;                     // W2 transposed into shared memory (SeGateShape)
  bool cache_maps;                   // the CTA's h and identity in shared memory (SeGateShape)
  bool programmatic_launch;          // see common/programmatic_launch.cuh
};

// Shared memory the kernel needs (bytes); HW = H * W matters only with cache_maps.
size_t se_gate_smem_bytes(int C, int R, int images_per_cta, bool stage_w2, int HW = 0, bool cache_maps = false);

struct SeGateShape {
  int images_per_cta = 1;  // 1, 2, 4 or 8
  bool stage_w2 = false;
  bool cache_maps = false;  // the maps cached (where it fits and pays)
  bool cache_fits = false;  // where it fits (CUTLASS_OPS_SE_CACHE=1 caches then)
};

// How to launch N images of H x W x C on a GPU with `num_sms` SMs, `max_smem_bytes` of
// shared memory per block, `smem_per_sm` per SM and `l2_bytes` of L2: W2 staged in shared
// memory when it fits, more than one image per CTA for small images while every SM still
// gets a CTA, and the CTA's h and identity cached in shared memory when h would not stay in
// L2 for its second read and two CTAs still fit an SM.
SeGateShape se_gate_shape(int N, int H, int W, int C, int R, int num_sms, size_t max_smem_bytes,
                          size_t smem_per_sm, size_t l2_bytes);

// Largest C the kernel takes (one thread per 8 channels of a pixel).
int se_gate_max_channels();

// Requirements: C % 8 == 0, C <= se_gate_max_channels() and 16-byte aligned h/identity/out (the op checks and falls
// back to ATen otherwise).  Returns the launch's cudaError.
// a.stage_w2, a.cache_maps and images_per_cta as se_gate_shape() said.
cudaError_t launch_se_gate(SeGateArgs const& a, int images_per_cta, cudaStream_t stream);

}  // namespace se_gate
}  // namespace cutlass_ops
