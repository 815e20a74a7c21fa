// The se_gate kernel (se_gate_kernel.h), torch-free and launch-free so that the CPU emulator
// can run it too (tests/cuda_emulator/se_gate_harness.cpp).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/grid_dependency.cuh"
#include "se_gate/se_gate_kernel.h"

namespace cutlass_ops {
namespace se_gate {

constexpr int kThreads = 512;  // one CTA per image: more warps hide more load latency
constexpr int kVec = 8;  // elements per 16-byte access
constexpr int kMaxImagesPerCta = 8;

template <typename T> struct Vec;
template <> struct Vec<__half> {
  static __device__ float2 to_float2(__half2 v) { return __half22float2(v); }
  static __device__ __half2 from_float2(float2 v) { return __float22half2_rn(v); }
  using T2 = __half2;
};
template <> struct Vec<__nv_bfloat16> {
  // One element at a time: CUDA 11.8 declares the paired bf16 conversions for sm80+ only,
  // and these kernels are built for sm70 too.
  static __device__ float2 to_float2(__nv_bfloat162 v) {
    return make_float2(__bfloat162float(v.x), __bfloat162float(v.y));
  }
  static __device__ __nv_bfloat162 from_float2(float2 v) {
    __nv_bfloat162 r;
    r.x = __float2bfloat16_rn(v.x);
    r.y = __float2bfloat16_rn(v.y);
    return r;
  }
  using T2 = __nv_bfloat162;
};

template <typename T>
__device__ void load8(T const* p, float (&v)[kVec]) {
  uint4 raw = *reinterpret_cast<uint4 const*>(p);
  auto const* pairs = reinterpret_cast<typename Vec<T>::T2 const*>(&raw);
#pragma unroll
  for (int i = 0; i < kVec / 2; ++i) {
    float2 f = Vec<T>::to_float2(pairs[i]);
    v[2 * i] = f.x;
    v[2 * i + 1] = f.y;
  }
}

template <typename T>
__device__ void store8(T* p, float const (&v)[kVec]) {
  uint4 raw;
  auto* pairs = reinterpret_cast<typename Vec<T>::T2*>(&raw);
#pragma unroll
  for (int i = 0; i < kVec / 2; ++i) pairs[i] = Vec<T>::from_float2(make_float2(v[2 * i], v[2 * i + 1]));
  *reinterpret_cast<uint4*>(p) = raw;
}

// Shared memory, in floats: the squeeze partials first (16-byte vector stores), then the
// per-image channel sums / gates, the hidden units, optionally W2 transposed, and optionally
// (cache_maps) the CTA's tiles of h and identity, 16-byte aligned: 16-bit elements, two per float.
struct SmemLayout {
  int partial, gate, hidden, w2t, maps, total;
  __host__ __device__ SmemLayout(int C, int R, int images, bool stage_w2, int HW = 0, bool cache_maps = false) {
    partial = 0;
    gate = partial + kThreads * kVec;
    hidden = gate + images * C;
    w2t = hidden + images * R;
    maps = (w2t + (stage_w2 ? R * (C + 1) : 0) + 3) / 4 * 4;
    total = maps + (cache_maps ? images * HW * C : 0);  // 2 maps x images*HW*C halves
  }
};

#ifndef CUTLASS_OPS_EMULATED_CP_ASYNC  // (the CPU emulator's harness brings its own: deferred copies)
// One 16-byte chunk global -> shared, asynchronously where the GPU can (sm80+: cp.async,
// bypassing registers and L1), else through registers.
__device__ __forceinline__ void copy16_async(void* smem_dst, void const* gmem_src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  unsigned const dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(gmem_src) : "memory");
#else
  *static_cast<uint4*>(smem_dst) = *static_cast<uint4 const*>(gmem_src);
#endif
}
__device__ __forceinline__ void copy_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
// Waits until at most `kPending` of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void copy_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
#endif
}
#endif

// The body of one CTA, which takes kImages consecutive images (more than one when there are
// plenty of CTAs: the excite weights are then read once per group, not once per image).
// se_gate_kernel below runs it; the CPU emulator calls it with its own shared memory (`smem`:
// SmemLayout's floats, 16-byte aligned).
template <typename T, int kImages>
__device__ __forceinline__ void se_gate_body(SeGateArgs const& a, float* smem) {
  int const HW = a.H * a.W;
  SmemLayout const layout(a.C, a.R, kImages, a.stage_w2, HW, a.cache_maps);
  int const n0 = blockIdx.x * kImages;
  int const images = min(kImages, a.N - n0);  // the last CTA may have fewer
  float* partial = smem + layout.partial;     // [kThreads][kVec]
  float* gate = smem + layout.gate;           // [images][C]: channel sums, then the gate
  float* hidden = smem + layout.hidden;       // [images][R]
  float* w2t = smem + layout.w2t;             // [R][C + 1] when a.stage_w2
  int const tid = threadIdx.x;
  size_t const base = size_t(n0) * HW * a.C;
  T const* h = static_cast<T const*>(a.h) + base;
  T const* idn = static_cast<T const*>(a.identity) + base;
  T* out = static_cast<T*>(a.out) + base;

  // With a.cache_maps the CTA's h and identity come into shared memory once, asynchronously:
  // h first (the squeeze waits for it), identity behind it (it lands during the squeeze and
  // the excite).  The squeeze and the gating then read shared memory, so h leaves HBM once
  // instead of twice, and the pooling reads the gated output back from there too.
  int const chunks = images * HW * a.C / kVec;  // 16-byte chunks per map
  T* h_tile = reinterpret_cast<T*>(smem + layout.maps);
  T* id_tile = h_tile + size_t(kImages) * HW * a.C;
  auto copy_map = [&](T* tile, T const* map) {  // one commit group
    for (int i = tid; i < chunks; i += kThreads) copy16_async(tile + i * kVec, map + size_t(i) * kVec);
    copy_async_commit();
  };
  if (a.cache_maps && a.gate_in == nullptr) copy_map(h_tile, h);
  if (a.cache_maps && a.means_out == nullptr) copy_map(id_tile, idn);
  if (a.cache_maps && a.gate_in != nullptr) copy_map(h_tile, h);  // se_gate_apply: no squeeze, h last
  T const* h_src = a.cache_maps ? h_tile : h;  // where the squeeze and the gating read h
  T const* id_src = a.cache_maps ? id_tile : idn;

  // W2 (C, R) transposed into shared memory, with coalesced loads now (they overlap the
  // squeeze's): read row-wise from global memory, thread-per-channel fc2 below touches a
  // different 128-byte line per lane, 32 L1 wavefronts per load.  The row pitch C + 1
  // keeps both the stores here and fc2's loads free of bank conflicts.
  if (a.stage_w2 && a.R % 4 == 0) {
    int const CR4 = a.C * a.R / 4;
    auto const* w2v = reinterpret_cast<float4 const*>(a.w2);  // 16-byte aligned (the op checks)
#pragma unroll 4
    for (int i = tid; i < CR4; i += kThreads) {
      float4 const w = w2v[i];
      float* dst = w2t + (4 * i % a.R) * (a.C + 1) + 4 * i / a.R;
      dst[0] = w.x;
      dst[a.C + 1] = w.y;
      dst[2 * (a.C + 1)] = w.z;
      dst[3 * (a.C + 1)] = w.w;
    }
  } else if (a.stage_w2) {
    int const CR = a.C * a.R;
#pragma unroll 8
    for (int i = tid; i < CR; i += kThreads) w2t[(i % a.R) * (a.C + 1) + i / a.R] = a.w2[i];
  }

  float const h_bias = a.h_bias ? *a.h_bias : 0.f;

  int const G = a.C / kVec;  // 8-channel groups per pixel
  if (a.gate_in != nullptr) {
    // se_gate_apply: the gate comes from the caller's excite MLP.
    T const* g_in = static_cast<T const*>(a.gate_in) + size_t(n0) * a.C;
    for (int i = tid; i < images * a.C; i += kThreads) gate[i] = static_cast<float>(g_in[i]);
    __syncthreads();
  } else {
    if (a.cache_maps) {  // h landed (identity, committed after it, may still be in flight)
      if (a.means_out == nullptr) copy_async_wait<1>(); else copy_async_wait<0>();
      __syncthreads();
    }
    // Squeeze, deterministically (no atomics: the same input gives the same bits, graph or
    // not).  Thread t owns the 8 channels of group t % G (G = C/8 groups per pixel) and
    // strides over an image's pixels; the per-thread partials are then summed in a fixed order.
    int const rows_per_pass = kThreads / G;  // >= 1: the op guarantees C <= 8 * kThreads
    for (int img = 0; img < images; ++img) {
      int const g = tid % G, row0 = tid / G;
      float acc[kVec] = {};
      if (row0 < rows_per_pass) {
        T const* hi = h_src + size_t(img) * HW * a.C;
        for (int p = row0; p < HW; p += rows_per_pass) {
          float v[kVec];
          load8(hi + (size_t(p) * a.C + g * kVec), v);
#pragma unroll
          for (int j = 0; j < kVec; ++j) acc[j] += v[j];
        }
      }
      auto* mine = reinterpret_cast<float4*>(partial + tid * kVec);
      mine[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
      mine[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
      __syncthreads();
      for (int c = tid; c < a.C; c += kThreads) {
        float s = 0.f;
        for (int r = 0; r < rows_per_pass; ++r) s += partial[(r * G + c / kVec) * kVec + c % kVec];
        gate[img * a.C + c] = s + h_bias * HW;  // the sum of h + h_bias
      }
      __syncthreads();
    }

    if (a.means_out != nullptr) {  // se_squeeze: the means are the result
      T* means = static_cast<T*>(a.means_out) + size_t(n0) * a.C;
      for (int i = tid; i < images * a.C; i += kThreads) means[i] = static_cast<T>(gate[i] * (1.f / HW));
      return;
    }

    // Excite, first Linear + ReLU.  A group of `lanes` threads per hidden unit (a power of
    // two <= 32: as many as kThreads / R allows), each over every lanes-th float4 of the W1
    // row: coalesced 16-byte loads, all in flight at once, then a shuffle reduction.  Each W1
    // element is loaded once for all of the CTA's images.
    float const inv_hw = 1.f / HW;
    int lanes = 32;
    while (lanes > 1 && lanes * a.R > kThreads) lanes /= 2;
    int const sub = tid % lanes, unit = tid / lanes, units_per_pass = kThreads / lanes;
    int const C4 = a.C / 4;
    auto const* w1v = reinterpret_cast<float4 const*>(a.w1);  // 16-byte aligned (the op checks)
    for (int base = 0; base < a.R; base += units_per_pass) {  // same trip count in every warp
      int const r = base + unit;
      float dot[kImages] = {};
      if (r < a.R) {
#pragma unroll 4
        for (int c4 = sub; c4 < C4; c4 += lanes) {
          float4 const w = w1v[size_t(r) * C4 + c4];
#pragma unroll
          for (int i = 0; i < kImages; ++i) {
            if (i < images) {
              float4 const s = reinterpret_cast<float4 const*>(gate + i * a.C)[c4];
              dot[i] += w.x * s.x + w.y * s.y + w.z * s.z + w.w * s.w;
            }
          }
        }
      }
#pragma unroll
      for (int i = 0; i < kImages; ++i) {
        if (i >= images) break;
        float d = dot[i];
        for (int off = lanes / 2; off > 0; off /= 2) d += __shfl_xor_sync(0xffffffffu, d, off);
        if (sub == 0 && r < a.R) {  // (units past R read nothing: b1 has R entries)
          float const pre = d * inv_hw + a.b1[r];
          hidden[i * a.R + r] = pre < 0.f ? 0.f : pre;  // keeps NaN, like torch.relu
        }
      }
    }
    __syncthreads();  // hidden is complete, and every read of the sums is done

    // Second Linear + sigmoid: one thread per channel, each W2 element used for all of the
    // CTA's images, from the staged transpose when it fits (else from global memory, where
    // unrolling keeps several loads in flight).  The gate overwrites the sums.
    for (int c = tid; c < a.C; c += kThreads) {
      float dot[kImages] = {};
      if (a.stage_w2) {
#pragma unroll 8
        for (int r = 0; r < a.R; ++r) {
          float w = w2t[r * (a.C + 1) + c];
#pragma unroll
          for (int i = 0; i < kImages; ++i)
            if (i < images) dot[i] += w * hidden[i * a.R + r];
        }
      } else {
        float const* row = a.w2 + size_t(c) * a.R;
#pragma unroll 8
        for (int r = 0; r < a.R; ++r) {
          float w = row[r];
#pragma unroll
          for (int i = 0; i < kImages; ++i)
            if (i < images) dot[i] += w * hidden[i * a.R + r];
        }
      }
#pragma unroll
      for (int i = 0; i < kImages; ++i)
        if (i < images) gate[i * a.C + c] = 1.f / (1.f + __expf(-(dot[i] + a.b2[c])));
    }
    __syncthreads();
  }

  if (a.cache_maps) {  // identity (and se_gate_apply's h) landed
    copy_async_wait<0>();
    __syncthreads();
  }

  // Gate, residual, ReLU, the next block's input bias: the CTA's images are contiguous.
  float const idn_bias = a.identity_bias ? *a.identity_bias : 0.f;
  float const post = a.post_bias ? *a.post_bias : 0.f;
  int const groups_per_image = HW * G;
  for (int i = tid; i < images * groups_per_image; i += kThreads) {
    int const img = i / groups_per_image;
    int const c0 = (i % G) * kVec;
    float hv[kVec], iv[kVec], o[kVec];
    load8(h_src + size_t(i) * kVec, hv);
    load8(id_src + size_t(i) * kVec, iv);
    // Two 16-byte shared loads instead of eight 4-byte ones (8-way bank conflicts).
    float4 const* gi = reinterpret_cast<float4 const*>(gate + img * a.C + c0);
    float4 const g0 = gi[0], g1 = gi[1];
    float const gv[kVec] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      float v = (hv[j] + h_bias) * gv[j] + iv[j] + idn_bias;
      o[j] = (v < 0.f ? 0.f : v) + post;  // keeps NaN, like torch.relu
    }
    store8(out + size_t(i) * kVec, o);
    // The pooling below reads the output back: from shared memory when cached (over h's
    // element, which only this thread read).
    if (a.cache_maps && a.pooled != nullptr) store8(h_tile + size_t(i) * kVec, o);
  }
  if (a.pooled == nullptr) return;

  // AvgPool2d(3, 2, 1, count_include_pad=True) of these images' (rounded) output, read
  // back from shared memory (cached) or global memory: a block's own writes are visible to
  // it after __syncthreads.
  __syncthreads();
  int const PH = (a.H + 1) / 2, PW = (a.W + 1) / 2;
  T* pooled = static_cast<T*>(a.pooled) + size_t(n0) * PH * PW * a.C;
  for (int i = tid; i < images * PH * PW * G; i += kThreads) {
    int g = i % G, q = (i / G) % PW, p = (i / G / PW) % PH, img = i / G / PW / PH;
    T const* oi = (a.cache_maps ? h_tile : out) + size_t(img) * HW * a.C;
    float acc[kVec] = {};
    for (int dy = -1; dy <= 1; ++dy) {
      int y = 2 * p + dy;
      if (y < 0 || y >= a.H) continue;
      for (int dx = -1; dx <= 1; ++dx) {
        int x = 2 * q + dx;
        if (x < 0 || x >= a.W) continue;
        float v[kVec];
        load8(oi + (size_t(y) * a.W + x) * a.C + g * kVec, v);
#pragma unroll
        for (int j = 0; j < kVec; ++j) acc[j] += v[j];
      }
    }
#pragma unroll
    for (int j = 0; j < kVec; ++j) acc[j] *= 1.f / 9.f;
    store8(pooled + size_t(i) * kVec, acc);
  }
}

template <typename T, int kImages>
__global__ void __launch_bounds__(kThreads, 2) se_gate_kernel(SeGateArgs a) {
  wait_for_previous_grid();
  extern __shared__ __align__(16) float se_gate_smem[];
  se_gate_body<T, kImages>(a, se_gate_smem);
}

}  // namespace se_gate
}  // namespace cutlass_ops
