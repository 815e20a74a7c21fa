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

// One thread per (image, row, kVec consecutive channels), grid-stride: kVec = 8 (16-byte
// accesses) where c % 8 == 0 and every pointer is 16-byte aligned, else 1.  A lead row copies
// lead_tokens into every output; a map row (input pixel iy, ix) loads its 3x3 window once (zero
// padding) and writes each projection's output centred there: every pixel for stride 1, the
// pixels with iy and ix even for stride 2 (output (iy/2, ix/2)), the window summed in float32
// on top of the bias.
template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads) dw_conv_kernel(DwConvArgs a) {
  T const* x = static_cast<T const*>(a.x);
  const int chunks = a.c / kVec;
  const long long rows = a.lead + static_cast<long long>(a.h) * a.w;
  const long long total = a.n * rows * chunks;
  // (kThreads, not blockDim: the launch's block size, and the CPU emulator has no blockDim)
  for (long long i = blockIdx.x * static_cast<long long>(kThreads) + threadIdx.x; i < total;
       i += static_cast<long long>(gridDim.x) * kThreads) {
    const int c0 = static_cast<int>(i % chunks) * kVec;
    const long long r = (i / chunks) % rows, img = i / chunks / rows;
    if (r < a.lead) {
      HalfChunk<T, kVec> v;
      v.load(static_cast<T const*>(a.lead_tokens) + img * a.lead_image_stride + r * a.c + c0);
      for (int j = 0; j < a.projections; ++j) {
        const long long out_rows = a.lead + static_cast<long long>(a.ho[j]) * a.wo[j];
        v.store(static_cast<T*>(a.y[j]) + (img * out_rows + r) * a.c + c0);
      }
      continue;
    }
    const int p = static_cast<int>(r - a.lead), iy = p / a.w, ix = p % a.w;
    // The 3x3 window, zeros outside the map, kept in 16-bit (registers: every projection reads it)
    HalfChunk<T, kVec> win[9];
#pragma unroll
    for (int ky = 0; ky < 3; ++ky) {
#pragma unroll
      for (int kx = 0; kx < 3; ++kx) {
        const int y = iy - 1 + ky, xx = ix - 1 + kx;
        if (y < 0 || y >= a.h || xx < 0 || xx >= a.w) {
#pragma unroll
          for (int e = 0; e < kVec; ++e) win[ky * 3 + kx].v[e] = from_float<T>(0.0f);
        } else {
          win[ky * 3 + kx].load(x + img * a.x_image_stride + (static_cast<long long>(y) * a.w + xx) * a.c + c0);
        }
      }
    }
    for (int j = 0; j < a.projections; ++j) {
      long long q;  // output pixel of projection j centred at (iy, ix)
      if (a.stride[j] == 1) {
        q = p;
      } else {
        if ((iy | ix) & 1) continue;
        q = static_cast<long long>(iy / 2) * a.wo[j] + ix / 2;
      }
      const long long taps = (static_cast<long long>(j) * a.c + c0) * 9;  // weight[j][c0][0][0]
      float acc[kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e)
        acc[e] = a.bias ? load_param<T>(a.bias, static_cast<long long>(j) * a.c + c0 + e, a.params_f32) : 0.0f;
      bool done = false;
      if constexpr (kVec == 8) {
        if (!a.params_f32) {  // the chunk's 9 taps x 8 channels: 72 consecutive elements, nine 16-byte loads
          HalfChunk<T, 8> wt[9];
#pragma unroll
          for (int k = 0; k < 9; ++k) wt[k].load(static_cast<T const*>(a.weight) + taps + 8 * k);
#pragma unroll
          for (int e = 0; e < 8; ++e) {
#pragma unroll
            for (int t = 0; t < 9; ++t) acc[e] += to_float(win[t].v[e]) * to_float(wt[(e * 9 + t) / 8].v[(e * 9 + t) % 8]);
          }
          done = true;
        }
      }
      if (!done) {
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
#pragma unroll
          for (int t = 0; t < 9; ++t) acc[e] += to_float(win[t].v[e]) * load_param<T>(a.weight, taps + e * 9 + t, a.params_f32);
        }
      }
      const long long out_rows = a.lead + static_cast<long long>(a.ho[j]) * a.wo[j];
      store_floats<kVec>(static_cast<T*>(a.y[j]) + (img * out_rows + a.lead + q) * a.c + c0, acc);
    }
  }
}

// 16-byte chunks where the channels and every pointer allow it.
inline int dw_conv_vec(DwConvArgs const& a) {
  bool ok = a.c % 8 == 0 && a.x_image_stride % 8 == 0 && aligned16(a.x) &&
            (a.lead == 0 || (aligned16(a.lead_tokens) && a.lead_image_stride % 8 == 0));
  for (int j = 0; j < a.projections; ++j) ok = ok && aligned16(a.y[j]);
  // 16-bit weights are read as 16-byte chunks too (load_taps): their start must be aligned
  if (!a.params_f32) ok = ok && aligned16(a.weight);
  return ok ? 8 : 1;
}

// CTAs for the launch: one thread per (row, chunk), grid-stride beyond `cap` CTAs.
inline long long dw_conv_ctas(DwConvArgs const& a, int vec, long long cap) {
  const long long work = a.n * (a.lead + static_cast<long long>(a.h) * a.w) * (a.c / vec);
  const long long need = (work + kThreads - 1) / kThreads;
  return need < cap ? (need > 0 ? need : 1) : cap;
}

}  // namespace dw_conv
}  // namespace cutlass_ops
