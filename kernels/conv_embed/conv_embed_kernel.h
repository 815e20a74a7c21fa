// The strided conv of a token embedding, its bias and a LayerNorm over its output channels, in one
// kernel: input (N, C, H, W) of few channels in any strides (an image batch as the user holds it,
// NCHW) -> tokens (N, P*Q, K), contiguous.  CvT's first embedding (7x7/4, 3 -> 64, then LayerNorm).
// No torch here; the torch side is conv_embed_cuda.cpp.
#pragma once

#include <cuda_runtime.h>

namespace cutlass_ops {
namespace conv_embed {

enum class DType { kF16, kBF16 };

struct ConvEmbedArgs {
  DType dtype;
  int N, C, H, W;                      // input
  int K, R, S;                         // weight (K, C, R, S)
  int stride_h, stride_w, pad_h, pad_w;
  int P, Q;                            // output height and width
  long long in_stride[4];              // input element strides (n, c, h, w)
  long long w_stride[4];               // weight element strides (k, c, r, s)
  void const* input;
  void const* weight;
  float const* bias;                   // (K,) float32 or nullptr
  float const* ln_weight;              // (K,) float32 or nullptr (then 1)
  float const* ln_bias;                // (K,) float32 or nullptr (then 0)
  bool layer_norm;                     // LayerNorm over K after the bias
  float eps;
  void* output;                        // (N * P * Q, K) contiguous
  bool paired_loads;                   // stride_w 1, even n/c/h strides, even stride_w and pad_w, even
                                       // W, a 4-byte aligned input: two columns a load
  bool programmatic_launch;
};

// Whether the kernel takes this problem: fp16 on sm70+, bf16 on sm80+; a kernel at most 8 wide
// with C*R <= 32 (the patch row, C*R window rows of 8, in shared memory); K 32, 64 or 128.
bool kernel_supports(DType dtype, int cc, int C, int R, int S, int K);

// Returns the launch's cudaError.
cudaError_t launch_conv_embed(ConvEmbedArgs const& a, int num_sms, cudaStream_t stream);

}  // namespace conv_embed
}  // namespace cutlass_ops
