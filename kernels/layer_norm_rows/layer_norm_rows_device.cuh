// The LayerNorm kernel (layer_norm_rows_kernel.h), torch-free and launch-free so that the CPU
// emulator can run it too (tests/python/test_layer_norm.py).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "common/half_chunk.cuh"
#include "layer_norm_rows/layer_norm_rows_kernel.h"

namespace cutlass_ops {
namespace layer_norm {

// sum over the kLanes lanes of a row's group (xor offsets below kLanes stay in the group)
template <int kLanes>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int o = kLanes / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

constexpr int kThreads = 256;

// One row's chunk of kVec elements: a 16-byte access (kVec 8) or one element.
template <typename T, int kVec>
__device__ __forceinline__ void load_chunk(T (&v)[kVec], T const* p) {
  if constexpr (kVec == 8) {
    *reinterpret_cast<uint4*>(v) = *reinterpret_cast<uint4 const*>(p);
  } else {
    v[0] = p[0];
  }
}

template <typename T, int kVec>
__device__ __forceinline__ void store_chunk(T* p, T const (&v)[kVec]) {
  if constexpr (kVec == 8) {
    *reinterpret_cast<uint4*>(p) = *reinterpret_cast<uint4 const*>(v);
  } else {
    p[0] = v[0];
  }
}

// kVec elements per chunk (8: 16-byte accesses, cols % 8 == 0 and aligned; else 1), kLanes
// lanes per row (32 / kLanes rows per warp at once), kChunks chunks per lane (a row of up to
// kLanes * kChunks * kVec columns, held in registers between the two reductions).
template <typename T, int kVec, int kLanes, int kChunks, bool kResidual>
__global__ void __launch_bounds__(kThreads) layer_norm_kernel(LayerNormArgs a) {
  constexpr int kRowsPerWarp = 32 / kLanes;
  const int lane = threadIdx.x & 31, sub = lane % kLanes;
  const long long warps = (long long)gridDim.x * (kThreads / 32);
  const long long warp = (long long)blockIdx.x * (kThreads / 32) + threadIdx.x / 32;
  T const* x = static_cast<T const*>(a.x);
  T const* r = static_cast<T const*>(a.residual);
  T* y = static_cast<T*>(a.y);
  T* s = static_cast<T*>(a.sum);
  // Every lane runs the same number of iterations (the shuffles need the whole warp): a
  // group whose row is past the end computes on nothing and stores nothing.
  for (long long row0 = warp * kRowsPerWarp; row0 < a.rows; row0 += warps * kRowsPerWarp) {
    const long long row = row0 + lane / kLanes;
    const bool live = row < a.rows;
    float v[kChunks][kVec];
    float total = 0.0f;
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      const int c = (sub + k * kLanes) * kVec;
      const bool here = live && c < a.cols;
#pragma unroll
      for (int e = 0; e < kVec; ++e) v[k][e] = 0.0f;
      if (here) {
        const long long at = row * a.cols + c;
        T xv[kVec];
        load_chunk<T, kVec>(xv, x + at);
        if constexpr (kResidual) {
          T rv[kVec];
          load_chunk<T, kVec>(rv, r + at);
#pragma unroll
          for (int e = 0; e < kVec; ++e) xv[e] = from_float<T>(to_float(xv[e]) + to_float(rv[e]));
          store_chunk<T, kVec>(s + at, xv);
        }
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          v[k][e] = to_float(xv[e]);
          total += v[k][e];
        }
      }
    }
    const float mean = group_sum<kLanes>(total) / (float)a.cols;
    float sq = 0.0f;
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      const int c = (sub + k * kLanes) * kVec;
      if (live && c < a.cols) {
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          const float d = v[k][e] - mean;
          sq += d * d;
        }
      }
    }
    const float rstd = rsqrtf(group_sum<kLanes>(sq) / (float)a.cols + a.eps);
    if (live && sub == 0) {
      a.mean[row] = mean;
      a.rstd[row] = rstd;
    }
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      const int c = (sub + k * kLanes) * kVec;
      if (live && c < a.cols) {
        T out[kVec];
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          const float w = a.weight ? load_param<T>(a.weight, c + e, a.params_f32) : 1.0f;
          const float b = a.bias ? load_param<T>(a.bias, c + e, a.params_f32) : 0.0f;
          out[e] = from_float<T>((v[k][e] - mean) * rstd * w + b);
        }
        store_chunk<T, kVec>(y + row * a.cols + c, out);
      }
    }
  }
}

// How the kernels cover a row: kVec, kLanes, kChunks (lanes == 0: not covered).  16-byte
// chunks where every row starts aligned; lanes per row and chunks per lane so that a row fits
// the registers (up to 2048 columns with 16-byte chunks, 512 without; the backward, which
// holds two values and two sums per column, up to 1024 with 16-byte chunks).
struct LayerNormShape {
  int vec, lanes, chunks;
};

inline LayerNormShape row_shape(int cols, bool vec8, int max_chunks8) {
  const int vec = vec8 ? 8 : 1, n = cols / vec;
  if (vec8) {
    if (n <= 4) return {8, 4, 1};
    if (n <= 8) return {8, 8, 1};
    if (n <= 16) return {8, 16, 1};
  }
  for (int chunks = 1; chunks <= (vec8 ? max_chunks8 : 16); chunks *= 2)
    if (n <= 32 * chunks) return {vec, 32, chunks};
  return {vec, 0, 0};
}

inline LayerNormShape layer_norm_shape(LayerNormArgs const& a) {
  const bool vec8 = a.cols % 8 == 0 && aligned16(a.x) && aligned16(a.y) &&
                    (a.residual == nullptr || (aligned16(a.residual) && aligned16(a.sum)));
  return row_shape(a.cols, vec8, 8);
}

inline LayerNormShape layer_norm_backward_shape(LayerNormBackwardArgs const& a) {
  const bool vec8 = a.cols % 8 == 0 && aligned16(a.grad_y) && aligned16(a.s) && aligned16(a.grad_x) &&
                    (a.grad_sum == nullptr || aligned16(a.grad_sum));
  return row_shape(a.cols, vec8, 4);
}

// Calls f.template run<kVec, kLanes, kChunks>() for the shape (one of the instantiated ones).
template <class F>
auto with_layer_norm_shape(LayerNormShape sh, F const& f) {
  if (sh.vec == 8) {
    if (sh.lanes == 4) return f.template run<8, 4, 1>();
    if (sh.lanes == 8) return f.template run<8, 8, 1>();
    if (sh.lanes == 16) return f.template run<8, 16, 1>();
    switch (sh.chunks) {
      case 1: return f.template run<8, 32, 1>();
      case 2: return f.template run<8, 32, 2>();
      case 4: return f.template run<8, 32, 4>();
      default: return f.template run<8, 32, 8>();
    }
  }
  switch (sh.chunks) {
    case 1: return f.template run<1, 32, 1>();
    case 2: return f.template run<1, 32, 2>();
    case 4: return f.template run<1, 32, 4>();
    case 8: return f.template run<1, 32, 8>();
    default: return f.template run<1, 32, 16>();
  }
}

// CTAs for `rows` rows at this shape: one row group per warp, grid-stride beyond `cap` CTAs.
inline long long layer_norm_ctas(long long rows, int lanes, long long cap) {
  const long long rows_per_cta = (kThreads / 32) * (32 / lanes);
  const long long need = (rows + rows_per_cta - 1) / rows_per_cta;
  return need < cap ? (need > 0 ? need : 1) : cap;
}

// The backward of layer_norm_kernel, one pass: with xhat = (s - mean) * rstd and g = grad_y *
// weight, grad_x = rstd * (g - mean(g) - xhat * mean(g * xhat)) (+ grad_sum), float32 inside,
// written in T; with kParamGrads each CTA also writes its rows' sums of grad_y * xhat (the
// weight's gradient) and grad_y (the bias's) to its own row of a.partials, which the caller
// sums (no atomics: the CTA's warps add theirs in a fixed order, so the result does not depend
// on the schedule; a row per CTA, not per warp: the H200's N=64 CvT training step spent 0.31 ms
// summing per-warp rows).  Rows are laid out over lanes as in the forward, so a lane's columns
// are the same in every row it takes.
template <typename T, int kVec, int kLanes, int kChunks, bool kGradSum, bool kParamGrads>
__global__ void __launch_bounds__(kThreads) layer_norm_backward_kernel(LayerNormBackwardArgs a) {
  constexpr int kRowsPerWarp = 32 / kLanes;
  const int lane = threadIdx.x & 31, sub = lane % kLanes;
  const long long warps = (long long)gridDim.x * (kThreads / 32);
  const long long warp = (long long)blockIdx.x * (kThreads / 32) + threadIdx.x / 32;
  T const* gy = static_cast<T const*>(a.grad_y);
  T const* gs = static_cast<T const*>(a.grad_sum);
  T const* sv = static_cast<T const*>(a.s);
  T* gx = static_cast<T*>(a.grad_x);
  float dw[kChunks][kVec], db[kChunks][kVec];
#pragma unroll
  for (int k = 0; k < kChunks; ++k)
#pragma unroll
    for (int e = 0; e < kVec; ++e) dw[k][e] = db[k][e] = 0.0f;
  for (long long row0 = warp * kRowsPerWarp; row0 < a.rows; row0 += warps * kRowsPerWarp) {
    const long long row = row0 + lane / kLanes;
    const bool live = row < a.rows;
    const float mean = live ? a.mean[row] : 0.0f, rstd = live ? a.rstd[row] : 0.0f;
    float xh[kChunks][kVec], g[kChunks][kVec];
    float sum_gx = 0.0f, sum_g = 0.0f;
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      const int c = (sub + k * kLanes) * kVec;
#pragma unroll
      for (int e = 0; e < kVec; ++e) xh[k][e] = g[k][e] = 0.0f;
      if (live && c < a.cols) {
        const long long at = row * a.cols + c;
        T sc[kVec], gc[kVec];
        load_chunk<T, kVec>(sc, sv + at);
        load_chunk<T, kVec>(gc, gy + at);
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          const float d = to_float(gc[e]);
          xh[k][e] = (to_float(sc[e]) - mean) * rstd;
          g[k][e] = a.weight ? d * load_param<T>(a.weight, c + e, a.params_f32) : d;
          sum_gx += g[k][e] * xh[k][e];
          sum_g += g[k][e];
          if constexpr (kParamGrads) {
            dw[k][e] += d * xh[k][e];
            db[k][e] += d;
          }
        }
      }
    }
    const float c1 = group_sum<kLanes>(sum_gx) / (float)a.cols;
    const float c2 = group_sum<kLanes>(sum_g) / (float)a.cols;
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      const int c = (sub + k * kLanes) * kVec;
      if (live && c < a.cols) {
        const long long at = row * a.cols + c;
        float extra[kVec];
#pragma unroll
        for (int e = 0; e < kVec; ++e) extra[e] = 0.0f;
        if constexpr (kGradSum) {
          T gc[kVec];
          load_chunk<T, kVec>(gc, gs + at);
#pragma unroll
          for (int e = 0; e < kVec; ++e) extra[e] = to_float(gc[e]);
        }
        T out[kVec];
#pragma unroll
        for (int e = 0; e < kVec; ++e) out[e] = from_float<T>(rstd * (g[k][e] - c2 - xh[k][e] * c1) + extra[e]);
        store_chunk<T, kVec>(gx + at, out);
      }
    }
  }
  if constexpr (kParamGrads) {
    // the warp's row groups hold the same columns in lanes sub, sub + kLanes, ...: fold them
#pragma unroll
    for (int k = 0; k < kChunks; ++k)
#pragma unroll
      for (int e = 0; e < kVec; ++e)
#pragma unroll
        for (int o = kLanes; o < 32; o *= 2) {
          dw[k][e] += __shfl_xor_sync(0xffffffffu, dw[k][e], o);
          db[k][e] += __shfl_xor_sync(0xffffffffu, db[k][e], o);
        }
    // then the CTA's warps, one after the other, into shared memory, and one row per CTA out.
    // (static: CUDA's __shared__ arrays are per CTA; the CPU emulator runs one CTA at a time)
    constexpr int kCols = kChunks * kLanes * kVec;  // the widest row this instantiation takes
    static __shared__ float cta_sums[2][kCols];
    const int warp_in_cta = threadIdx.x / 32;
    for (int w = 0; w < kThreads / 32; ++w) {
      if (warp_in_cta == w && lane < kLanes) {
#pragma unroll
        for (int k = 0; k < kChunks; ++k) {
          const int c = (sub + k * kLanes) * kVec;
          if (c < a.cols) {
#pragma unroll
            for (int e = 0; e < kVec; ++e) {
              cta_sums[0][c + e] = w == 0 ? dw[k][e] : cta_sums[0][c + e] + dw[k][e];
              cta_sums[1][c + e] = w == 0 ? db[k][e] : cta_sums[1][c + e] + db[k][e];
            }
          }
        }
      }
      __syncthreads();
    }
    float* pw = a.partials + blockIdx.x * static_cast<long long>(a.cols);
    float* pb = a.partials + (a.partial_rows + blockIdx.x) * a.cols;
    for (int c = threadIdx.x; c < a.cols; c += kThreads) {
      pw[c] = cta_sums[0][c];
      pb[c] = cta_sums[1][c];
    }
  }
}

}  // namespace layer_norm
}  // namespace cutlass_ops
