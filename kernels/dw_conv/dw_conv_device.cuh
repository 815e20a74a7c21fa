// The depthwise conv kernel (dw_conv_kernel.h), torch-free and launch-free so that the CPU
// emulator can run it too (tests/python/test_dw_conv.py).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "common/half_chunk.cuh"
#include "dw_conv/dw_conv_kernel.h"

namespace cutlass_ops {
namespace dw_conv {

constexpr int kThreads = 256;
// Input pixels along a row per thread: even, so that stride-2 centres stay even; on the H200
// strips of 8 beat 4 and 2 (docs/results/cvt_h200_session13/).
constexpr int kStrip = 8;

// The window column at input x (3 rows around iy), zeros outside the map.
template <typename T, int kVec>
__device__ __forceinline__ void load_column(DwConvArgs const& a, T const* image, int iy, int x, int c0,
                                            HalfChunk<T, kVec> (&col)[3]) {
#pragma unroll
  for (int ky = 0; ky < 3; ++ky) {
    const int y = iy - 1 + ky;
    if (y < 0 || y >= a.h || x < 0 || x >= a.w) {
#pragma unroll
      for (int e = 0; e < kVec; ++e) col[ky].v[e] = from_float<T>(0.0f);
    } else {
      col[ky].load(image + (static_cast<long long>(y) * a.w + x) * a.c + c0);
    }
  }
}

// The 9 taps of kVec channels c0.. of projection j (w(e * 9 + t)).  kPacked (16-bit
// parameters, kVec == 8): the chunk's 9 taps x 8 channels are 72 consecutive elements, read as
// nine 16-byte loads and kept 16-bit (36 registers, not 72); otherwise floats, one load each.
template <typename T, int kVec, bool kPacked>
struct Taps {
  float w[kVec * 9];
  __device__ __forceinline__ Taps(void const* weight, bool f32, long long first) {
#pragma unroll
    for (int f = 0; f < kVec * 9; ++f) w[f] = load_param<T>(weight, first + f, f32);
  }
  __device__ __forceinline__ float operator()(int f) const { return w[f]; }
};

template <typename T>
struct Taps<T, 8, true> {
  HalfChunk<T, 8> w[9];
  __device__ __forceinline__ Taps(void const* weight, bool, long long first) {
#pragma unroll
    for (int k = 0; k < 9; ++k) w[k].load(static_cast<T const*>(weight) + first + 8 * k);
  }
  __device__ __forceinline__ float operator()(int f) const { return to_float(w[f / 8].v[f % 8]); }
};

// Projection j's outputs centred on row iy, input pixels x0 .. x0 + kStrip - 1 (every one for
// stride 1, the even ones for stride 2), one thread's kVec channels c0..: the weights read once
// per strip, the window slid along the row (each column loaded once, a step ahead of its use),
// float32 sums on the bias.
template <typename T, int kVec, int kStride, bool kPacked>
__device__ __forceinline__ void conv_strip(DwConvArgs const& a, int j, T const* image, long long img, int iy, int x0,
                                           int c0) {
  // weight[j][c0][0][0..]
  const Taps<T, kVec, kPacked> w(a.weight, a.params_f32, (static_cast<long long>(j) * a.c + c0) * 9);
  float bias[kVec];
#pragma unroll
  for (int e = 0; e < kVec; ++e)
    bias[e] = a.bias ? load_param<T>(a.bias, static_cast<long long>(j) * a.c + c0 + e, a.params_f32) : 0.0f;
  const long long out_rows = a.lead + static_cast<long long>(a.ho[j]) * a.wo[j];
  T* out = static_cast<T*>(a.y[j]) + (img * out_rows + a.lead + static_cast<long long>(iy / kStride) * a.wo[j]) * a.c + c0;
  HalfChunk<T, kVec> win[3][3];  // win[k]: the column at centre - 1 + k
  load_column<T, kVec>(a, image, iy, x0 - 1, c0, win[0]);
  load_column<T, kVec>(a, image, iy, x0, c0, win[1]);
  load_column<T, kVec>(a, image, iy, x0 + 1, c0, win[2]);
  const int end = x0 + kStrip < a.w ? x0 + kStrip : a.w;
#pragma unroll 1  // rolled: an unrolled strip keeps every step's loads in flight (255 registers)
  for (int x = x0; x < end; x += kStride) {  // x: the centre
    // the next step's new columns, loaded before this step's sums so that they overlap
    HalfChunk<T, kVec> next[kStride][3];
    if (x + kStride < end) {
#pragma unroll
      for (int k = 0; k < kStride; ++k) load_column<T, kVec>(a, image, iy, x + 2 + k, c0, next[k]);
    }
    float acc[kVec];
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      acc[e] = bias[e];
#pragma unroll
      for (int ky = 0; ky < 3; ++ky) {
#pragma unroll
        for (int kx = 0; kx < 3; ++kx) acc[e] += to_float(win[kx][ky].v[e]) * w(e * 9 + ky * 3 + kx);
      }
    }
    store_floats<kVec>(out + static_cast<long long>(x / kStride) * a.c, acc);
#pragma unroll
    for (int ky = 0; ky < 3; ++ky) {  // slide by kStride columns
      if constexpr (kStride == 1) {
        win[0][ky] = win[1][ky];
        win[1][ky] = win[2][ky];
        win[2][ky] = next[0][ky];
      } else {
        win[0][ky] = win[2][ky];
        win[1][ky] = next[0][ky];
        win[2][ky] = next[1][ky];
      }
    }
  }
}

// Threads of projection j: one per (image, output row, strip of kStrip input pixels, kVec
// channels), so that the stride-2 projections, with a quarter of the outputs, get threads for
// their rows only.
__host__ __device__ inline long long dw_conv_items(DwConvArgs const& a, int vec, int j) {
  return a.n * (a.stride[j] == 1 ? a.h : a.ho[j]) * static_cast<long long>((a.w + kStrip - 1) / kStrip) * (a.c / vec);
}

// One thread per item (dw_conv_items, projection after projection), grid-stride, the channel
// chunk fastest (a warp's loads coalesce): kVec = 8 (16-byte accesses) where c % 8 == 0 and
// every pointer is 16-byte aligned, else 1.  The threads of each output's first strip also copy
// lead_tokens into its lead rows.  kPacked: with_kernel_variant().  (Two CTAs an SM for the 16-bit
// weights; float32 weights of 8 channels take 72 registers more, which two CTAs would spill.)
template <typename T, int kVec, bool kPacked>
__global__ void __launch_bounds__(kThreads, kPacked ? 2 : 1) dw_conv_kernel(DwConvArgs a) {
  const int chunks = a.c / kVec;
  const int strips = (a.w + kStrip - 1) / kStrip;
  long long total = 0;
  for (int j = 0; j < a.projections; ++j) total += dw_conv_items(a, kVec, j);
  // (kThreads, not blockDim: the launch's block size, and the CPU emulator has no blockDim)
  for (long long i = blockIdx.x * static_cast<long long>(kThreads) + threadIdx.x; i < total;
       i += static_cast<long long>(gridDim.x) * kThreads) {
    int j = 0;
    long long k = i;
    while (k >= dw_conv_items(a, kVec, j)) k -= dw_conv_items(a, kVec, j++);
    const int c0 = static_cast<int>(k % chunks) * kVec;
    long long rest = k / chunks;
    const int strip = static_cast<int>(rest % strips);
    rest /= strips;
    const int rows = a.stride[j] == 1 ? a.h : a.ho[j];
    const int orow = static_cast<int>(rest % rows);
    const long long img = rest / rows;
    if (orow == 0 && strip == 0) {
      const long long out_rows = a.lead + static_cast<long long>(a.ho[j]) * a.wo[j];
      for (int r = 0; r < a.lead; ++r) {
        HalfChunk<T, kVec> v;
        v.load(static_cast<T const*>(a.lead_tokens) + img * a.lead_image_stride + static_cast<long long>(r) * a.c + c0);
        v.store(static_cast<T*>(a.y[j]) + (img * out_rows + r) * a.c + c0);
      }
    }
    T const* image = static_cast<T const*>(a.x) + img * a.x_image_stride;
    if (a.stride[j] == 1) {
      conv_strip<T, kVec, 1, kPacked>(a, j, image, img, orow, strip * kStrip, c0);
    } else {
      conv_strip<T, kVec, 2, kPacked>(a, j, image, img, 2 * orow, strip * kStrip, c0);
    }
  }
}

// ---- The input gradient (dw_conv_backward_input_kernel) ----------------------------------------
//
// grad_x = sum over the projections j of the transposed depthwise conv of grad_y[j]:
//   grad_x[y][x][c] = sum_{ky,kx} w_j[c][ky][kx] * grad_y_j[(y + 1 - ky) / s][(x + 1 - kx) / s][c]
// over the taps where y + 1 - ky and x + 1 - kx are multiples of the stride s and in the output
// map.  One thread per (image, input row, strip of kBackwardStrip pixels, kVec channels), as the
// forward kernel; each gradient element written once (no atomics), the sums in float32 in the order
// projection, ky, kx: deterministic.  Each gradient row's columns for the strip are loaded once
// (backward_row) and shared by its pixels' taps.  Where cuDNN ran a dgrad per projection and
// autograd added the three (190 / 133 / 75 us per attention, H100, N=64;
// docs/results/cvt_h100_session14/7_dw_backward_probe.log).
//
// Strips of 4 (even: stride-2 columns line up) with two CTAs an SM (16-bit taps: 128 registers,
// 128 bytes spilled): on an H100 at CvT's N=64 maps 61.9 / 51.0 / 29.6 us per attention, where
// one CTA an SM (no spills) took 71.1 / 57.1 / 28.0 and strips of 2 73.2 / 58.9 / 30.8.
constexpr int kBackwardStrip = 4;
constexpr int kBackwardMinBlocks = 2;

// One gradient row's contributions to the strip x0 .. x0 + kBackwardStrip - 1 (x0 even) through
// tap row ky: the row's columns the strip reads, loaded once (stride 1: x0 - 1 .. x0 + 4; stride 2:
// x0/2 .. x0/2 + 2, zeros past the map), then each pixel's taps kx with x + 1 - kx a multiple of
// the stride, in the order kx.
template <typename T, int kVec, bool kPacked, int kStride, int ky>
__device__ __forceinline__ void backward_row(T const* g_row, int x0, int wo, int c, Taps<T, kVec, kPacked> const& w,
                                             float (&acc)[kBackwardStrip][kVec]) {
  constexpr int kSeg = kStride == 1 ? kBackwardStrip + 2 : kBackwardStrip / 2 + 1;
  const int first = kStride == 1 ? x0 - 1 : x0 / 2;
  HalfChunk<T, kVec> seg[kSeg];
#pragma unroll
  for (int q = 0; q < kSeg; ++q) {
    const int ox = first + q;
    if (ox < 0 || ox >= wo) {
#pragma unroll
      for (int e = 0; e < kVec; ++e) seg[q].v[e] = from_float<T>(0.0f);
    } else {
      seg[q].load(g_row + static_cast<long long>(ox) * c);
    }
  }
#pragma unroll
  for (int p = 0; p < kBackwardStrip; ++p) {
#pragma unroll
    for (int kx = 0; kx < 3; ++kx) {
      const int u = p + 1 - kx;  // s * ox - x0
      if (kStride == 2 && (u & 1)) continue;
      const int q = kStride == 1 ? u + 1 : u / 2;  // seg index: ox - first
      if (q < 0 || q >= kSeg) continue;
#pragma unroll
      for (int e = 0; e < kVec; ++e) acc[p][e] += to_float(seg[q].v[e]) * w(e * 9 + ky * 3 + kx);
    }
  }
}

// Projection j's gradient row through tap row ky, if there is one for input row y.
template <typename T, int kVec, bool kPacked, int ky>
__device__ __forceinline__ void backward_rows(DwConvBackwardArgs const& a, int j, T const* g, int x0, int y,
                                              Taps<T, kVec, kPacked> const& w, float (&acc)[kBackwardStrip][kVec]) {
  const int s = a.stride[j], t = y + 1 - ky;  // t = s * oy
  if (t < 0 || t % s != 0 || t / s >= a.ho[j]) return;
  T const* g_row = g + static_cast<long long>(t / s) * a.wo[j] * a.c;
  if (s == 1) {
    backward_row<T, kVec, kPacked, 1, ky>(g_row, x0, a.wo[j], a.c, w, acc);
  } else {
    backward_row<T, kVec, kPacked, 2, ky>(g_row, x0, a.wo[j], a.c, w, acc);
  }
}

template <typename T, int kVec, bool kPacked>
__global__ void __launch_bounds__(kThreads, kPacked ? kBackwardMinBlocks : 1)
    dw_conv_backward_input_kernel(DwConvBackwardArgs a) {
  const int chunks = a.c / kVec;
  const int strips = (a.w + kBackwardStrip - 1) / kBackwardStrip;
  const long long total = a.n * a.h * static_cast<long long>(strips) * chunks;
  for (long long i = blockIdx.x * static_cast<long long>(kThreads) + threadIdx.x; i < total;
       i += static_cast<long long>(gridDim.x) * kThreads) {
    const int c0 = static_cast<int>(i % chunks) * kVec;
    long long rest = i / chunks;
    const int x0 = static_cast<int>(rest % strips) * kBackwardStrip;
    rest /= strips;
    const int y = static_cast<int>(rest % a.h);
    const long long img = rest / a.h;
    float acc[kBackwardStrip][kVec];
#pragma unroll
    for (int p = 0; p < kBackwardStrip; ++p) {
#pragma unroll
      for (int e = 0; e < kVec; ++e) acc[p][e] = 0.0f;
    }
    for (int j = 0; j < a.projections; ++j) {
      const Taps<T, kVec, kPacked> w(a.weight, a.params_f32, (static_cast<long long>(j) * a.c + c0) * 9);
      T const* g = static_cast<T const*>(a.grad_y[j]) + img * a.grad_image_stride[j] + c0;
      // (unrolled: ky indexes the taps, which a rolled loop would put in local memory)
      backward_rows<T, kVec, kPacked, 0>(a, j, g, x0, y, w, acc);
      backward_rows<T, kVec, kPacked, 1>(a, j, g, x0, y, w, acc);
      backward_rows<T, kVec, kPacked, 2>(a, j, g, x0, y, w, acc);
    }
    T* out = static_cast<T*>(a.grad_x) + (img * a.h + y) * static_cast<long long>(a.w) * a.c + c0;
#pragma unroll
    for (int p = 0; p < kBackwardStrip; ++p) {
      if (x0 + p < a.w) store_floats<kVec>(out + static_cast<long long>(x0 + p) * a.c, acc[p]);
    }
  }
}

// 16-byte chunks for the input gradient where the channels and every pointer allow it.
inline int dw_conv_backward_vec(DwConvBackwardArgs const& a) {
  bool ok = a.c % 8 == 0 && aligned16(a.grad_x);
  for (int j = 0; j < a.projections; ++j) ok = ok && aligned16(a.grad_y[j]) && a.grad_image_stride[j] % 8 == 0;
  if (!a.params_f32) ok = ok && aligned16(a.weight);
  return ok ? 8 : 1;
}

inline long long dw_conv_backward_ctas(DwConvBackwardArgs const& a, int vec, long long cap) {
  const long long work = a.n * a.h * static_cast<long long>((a.w + kBackwardStrip - 1) / kBackwardStrip) * (a.c / vec);
  const long long need = (work + kThreads - 1) / kThreads;
  return need < cap ? (need > 0 ? need : 1) : cap;
}

// 16-byte chunks where the channels and every pointer allow it.
inline int dw_conv_vec(DwConvArgs const& a) {
  bool ok = a.c % 8 == 0 && a.x_image_stride % 8 == 0 && aligned16(a.x) &&
            (a.lead == 0 || (aligned16(a.lead_tokens) && a.lead_image_stride % 8 == 0));
  for (int j = 0; j < a.projections; ++j) ok = ok && aligned16(a.y[j]);
  // 16-bit weights are read as 16-byte chunks too (Taps): their start must be aligned
  if (!a.params_f32) ok = ok && aligned16(a.weight);
  return ok ? 8 : 1;
}

// The kernel variant to run, for the launcher (dw_conv_kernel.cu) and the CPU emulator alike:
// calls run(Vec, Packed) once, Vec a std::integral_constant<int, 8 or 1> (the vector width) and
// Packed a std::bool_constant, true where the weights are read as 16-byte chunks and kept 16-bit
// (Taps): 16-bit parameters and 16-byte accesses.  The same for the forward and backward kernels.
template <class Run>
void with_kernel_variant(int vec, bool params_f32, Run&& run) {
  if (vec == 8 && !params_f32) {
    run(std::integral_constant<int, 8>{}, std::true_type{});
  } else if (vec == 8) {
    run(std::integral_constant<int, 8>{}, std::false_type{});
  } else {
    run(std::integral_constant<int, 1>{}, std::false_type{});
  }
}

// CTAs for the launch: one thread per item, grid-stride beyond `cap` CTAs.
inline long long dw_conv_ctas(DwConvArgs const& a, int vec, long long cap) {
  long long work = 0;
  for (int j = 0; j < a.projections; ++j) work += dw_conv_items(a, vec, j);
  const long long need = (work + kThreads - 1) / kThreads;
  return need < cap ? (need > 0 ? need : 1) : cap;
}

}  // namespace dw_conv
}  // namespace cutlass_ops
