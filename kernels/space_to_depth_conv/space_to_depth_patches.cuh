// The patch matrix of space-to-depth by 4, loaded into shared memory: row `pix` holds output
// pixel m0 + pix's 16C inputs at column dy*4C + dx*C + c (zeros past the last pixel).  Shared
// by the forward kernel (A of y = patches * W^T) and the weight-gradient kernel
// (B of dW = grad^T * patches).
#pragma once

#include <cstdint>

namespace cutlass_ops {
namespace space_to_depth_conv {

constexpr int kBlock = 4;  // space-to-depth factor

// Input (N, C, H, W) with element strides; rows of `lda` elements.  Each thread owns
// (pixel, dx) pairs, neighbouring threads the neighbouring input columns (dx fastest, then
// q), and walks that column's C x 4 values: coalesced across a warp.
template <typename T, int kThreads>
__device__ inline void load_patches(T const* x, int N, int C, int H, int W, int64_t stride_n, int64_t stride_c,
                                    int64_t stride_h, int64_t stride_w, int m0, int pixels, T* A, int lda) {
  int const P = H / kBlock, Q = W / kBlock;
  int const M = N * P * Q;  // < 2^31: the ops check the sizes
  for (int j = threadIdx.x; j < pixels * kBlock; j += kThreads) {
    int const dx = j % kBlock, pix = j / kBlock;
    int const m = m0 + pix;
    T* row = A + pix * lda + dx * C;
    if (m < M) {
      int const n = m / (P * Q), pq = m % (P * Q), p = pq / Q, q = pq % Q;
      T const* src = x + n * stride_n + (kBlock * p) * stride_h + (kBlock * q + dx) * stride_w;
      for (int c = 0; c < C; ++c) {
#pragma unroll
        for (int dy = 0; dy < kBlock; ++dy) row[dy * kBlock * C + c] = src[c * stride_c + dy * stride_h];
      }
    } else {
      for (int c = 0; c < C; ++c) {
#pragma unroll
        for (int dy = 0; dy < kBlock; ++dy) row[dy * kBlock * C + c] = T(0.f);
      }
    }
  }
}

}  // namespace space_to_depth_conv
}  // namespace cutlass_ops
