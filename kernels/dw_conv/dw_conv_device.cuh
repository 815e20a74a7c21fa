// The depthwise conv kernel (dw_conv_kernel.h), torch-free and launch-free so that the CPU
// emulator can run it too (tests/python/test_dw_conv.py).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/half_chunk.cuh"
#include "dw_conv/dw_conv_kernel.h"

namespace cutlass_ops {
namespace dw_conv {

constexpr int kThreads = 256;

// One thread per (output row, kVec consecutive channels), grid-stride: kVec = 8 (16-byte
// accesses) where c % 8 == 0 and every pointer is 16-byte aligned, else 1.  A row of the
// output's lead copies lead_tokens; a conv row sums its 3x3 window (zero padding) in float32
// on top of the bias.
template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads) dw_conv_kernel(DwConvArgs a) {
  T const* x = static_cast<T const*>(a.x);
  T* y = static_cast<T*>(a.y);
  const int chunks = a.c / kVec;
  const long long rows = a.lead + static_cast<long long>(a.ho) * a.wo;
  const long long total = a.n * rows * chunks;
  // (kThreads, not blockDim: the launch's block size, and the CPU emulator has no blockDim)
  for (long long i = blockIdx.x * static_cast<long long>(kThreads) + threadIdx.x; i < total;
       i += static_cast<long long>(gridDim.x) * kThreads) {
    const int c0 = static_cast<int>(i % chunks) * kVec;
    const long long r = (i / chunks) % rows, img = i / chunks / rows;
    T* out = y + (img * rows + r) * a.c + c0;
    if (r < a.lead) {
      HalfChunk<T, kVec> v;
      v.load(static_cast<T const*>(a.lead_tokens) + (img * a.lead + r) * a.c + c0);
      v.store(out);
      continue;
    }
    const int p = static_cast<int>(r - a.lead), oy = p / a.wo, ox = p % a.wo;
    float acc[kVec];
#pragma unroll
    for (int e = 0; e < kVec; ++e) acc[e] = a.bias ? load_param<T>(a.bias, c0 + e, a.params_f32) : 0.0f;
#pragma unroll
    for (int ky = 0; ky < 3; ++ky) {
      const int iy = oy * a.stride - 1 + ky;
      if (iy < 0 || iy >= a.h) continue;
#pragma unroll
      for (int kx = 0; kx < 3; ++kx) {
        const int ix = ox * a.stride - 1 + kx;
        if (ix < 0 || ix >= a.w) continue;
        float v[kVec];
        load_floats<kVec>(x + img * a.x_image_stride + (static_cast<long long>(iy) * a.w + ix) * a.c + c0, v);
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[e] += v[e] * load_param<T>(a.weight, (c0 + e) * 9LL + ky * 3 + kx, a.params_f32);
      }
    }
    store_floats<kVec>(out, acc);
  }
}

// 16-byte chunks where the channels and every pointer allow it.
inline int dw_conv_vec(DwConvArgs const& a) {
  return a.c % 8 == 0 && a.x_image_stride % 8 == 0 && aligned16(a.x) && aligned16(a.y) &&
                 (a.lead == 0 || aligned16(a.lead_tokens))
             ? 8
             : 1;
}

// CTAs for the launch: one thread per (row, chunk), grid-stride beyond `cap` CTAs.
inline long long dw_conv_ctas(DwConvArgs const& a, int vec, long long cap) {
  const long long work = a.n * (a.lead + static_cast<long long>(a.ho) * a.wo) * (a.c / vec);
  const long long need = (work + kThreads - 1) / kThreads;
  return need < cap ? (need > 0 ? need : 1) : cap;
}

}  // namespace dw_conv
}  // namespace cutlass_ops
