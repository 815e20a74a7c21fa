// Multi-head attention over token tensors, for few keys: q (N, Lq, H*64), k and v (N, Lkv, H*64)
// -> o (N, Lq, H*64) = softmax(scale q_h k_h^T) v_h per head h, Lkv <= 256.  CvT's attentions
// past stage 1 (784 queries on 196 keys, 197 on 50), where the keys of one head fit in shared
// memory and cuDNN's flash kernel, built for long sequences, ran at a third of the bandwidth.
// No torch here; the torch side is attention_cuda.cpp.
#pragma once

#include <cuda_runtime.h>

namespace cutlass_ops {
namespace attention {

enum class DType { kF16, kBF16 };

constexpr int kHeadDim = 64;
constexpr int kMaxKeys = 256;

struct AttentionArgs {
  DType dtype;
  int n, lq, lkv, heads;
  long long q_row_stride, k_row_stride, v_row_stride;      // elements between tokens (>= heads * 64)
  long long q_image_stride, k_image_stride, v_image_stride;  // elements between images
  void const* q;
  void const* k;
  void const* v;
  void* o;  // (n, lq, heads * 64) contiguous
  float scale;  // > 0
  bool programmatic_launch;
};

// Whether the kernel takes this problem: sm80+, 1 <= Lkv <= 256, 16-byte aligned rows (the
// caller checks pointers and strides).
bool kernel_supports(int cc, int lkv);

// Returns the launch's cudaError.
cudaError_t launch_attention(AttentionArgs const& a, cudaStream_t stream);

}  // namespace attention
}  // namespace cutlass_ops
