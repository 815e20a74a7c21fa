#include "se_gate/se_gate_kernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace cutlass_ops {
namespace se_gate {

namespace {

constexpr int kThreads = 512;  // one CTA per image: more warps hide more load latency
constexpr int kVec = 8;  // elements per 16-byte access

template <typename T> struct Vec;
template <> struct Vec<__half> {
  static __device__ float2 to_float2(__half2 v) { return __half22float2(v); }
  static __device__ __half2 from_float2(float2 v) { return __float22half2_rn(v); }
  using T2 = __half2;
};
template <> struct Vec<__nv_bfloat16> {
  static __device__ float2 to_float2(__nv_bfloat162 v) { return __bfloat1622float2(v); }
  static __device__ __nv_bfloat162 from_float2(float2 v) { return __float22bfloat162_rn(v); }
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

template <typename T>
__global__ void __launch_bounds__(kThreads) se_gate_kernel(SeGateArgs a) {
  extern __shared__ float smem[];
  float* sums = smem;          // [C]: channel sums, then the gate
  float* hidden = smem + a.C;  // [R]
  int const n = blockIdx.x;
  int const tid = threadIdx.x;
  int const HW = a.H * a.W;
  size_t const base = size_t(n) * HW * a.C;
  T const* h = static_cast<T const*>(a.h) + base;
  T const* idn = static_cast<T const*>(a.identity) + base;
  T* out = static_cast<T*>(a.out) + base;
  int const groups = HW * a.C / kVec;
  // Squeeze, deterministically (no atomics: the same input gives the same bits, graph or
  // not).  Thread t owns the 8 channels of group t % G (G = C/8 groups per pixel) and
  // strides over pixels; the per-thread partials are then summed in a fixed order.
  {
    int const G = a.C / kVec;
    int const rows_per_pass = kThreads / G;  // >= 1: the op guarantees C <= 8 * kThreads
    int const g = tid % G, row0 = tid / G;
    float acc[kVec] = {};
    if (row0 < rows_per_pass) {
      for (int p = row0; p < HW; p += rows_per_pass) {
        float v[kVec];
        load8(h + (size_t(p) * a.C + g * kVec), v);
#pragma unroll
        for (int j = 0; j < kVec; ++j) acc[j] += v[j];
      }
    }
    float* partial = smem + a.C + a.R;  // [kThreads][kVec], after sums and hidden
#pragma unroll
    for (int j = 0; j < kVec; ++j) partial[tid * kVec + j] = acc[j];
    __syncthreads();
    for (int c = tid; c < a.C; c += kThreads) {
      float s = 0.f;
      for (int r = 0; r < rows_per_pass; ++r) s += partial[(r * G + c / kVec) * kVec + c % kVec];
      sums[c] = s;
    }
  }
  __syncthreads();

  // Excite, first Linear + ReLU: one warp per hidden unit, lanes over channels.
  float const inv_hw = 1.f / HW;
  int const warp = tid / 32, lane = tid % 32;
  for (int r = warp; r < a.R; r += kThreads / 32) {
    float dot = 0.f;
#pragma unroll 4
    for (int c = lane; c < a.C; c += 32) dot += a.w1[size_t(r) * a.C + c] * sums[c];
    for (int off = 16; off > 0; off /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, off);
    if (lane == 0) hidden[r] = fmaxf(dot * inv_hw + a.b1[r], 0.f);
  }
  __syncthreads();

  // Second Linear + sigmoid: one thread per channel.  Its loads of a W2 row are
  // independent, so unrolling keeps several in flight (latency, not bandwidth, is what
  // limits this phase: W2 is small and L2-resident).  The gate overwrites the sums.
  __syncthreads();  // (all reads of sums above are done)
  for (int c = tid; c < a.C; c += kThreads) {
    float const* row = a.w2 + size_t(c) * a.R;
    float dot = a.b2[c];
#pragma unroll 8
    for (int r = 0; r < a.R; ++r) dot += row[r] * hidden[r];
    sums[c] = 1.f / (1.f + __expf(-dot));
  }
  __syncthreads();

  // Gate, residual, ReLU, the next block's input bias.
  float const idn_bias = a.identity_bias ? *a.identity_bias : 0.f;
  float const post = a.post_bias ? *a.post_bias : 0.f;
  for (int i = tid; i < groups; i += kThreads) {
    int c0 = (i * kVec) % a.C;
    float hv[kVec], iv[kVec], o[kVec];
    load8(h + size_t(i) * kVec, hv);
    load8(idn + size_t(i) * kVec, iv);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      float v = hv[j] * sums[c0 + j] + iv[j] + idn_bias;
      o[j] = (v < 0.f ? 0.f : v) + post;  // keeps NaN, like torch.relu
    }
    store8(out + size_t(i) * kVec, o);
  }
  if (a.pooled == nullptr) return;

  // AvgPool2d(3, 2, 1, count_include_pad=True) of this image's (rounded) output, read back
  // from global memory: a block's own writes are visible to it after __syncthreads.
  __syncthreads();
  int const PH = (a.H + 1) / 2, PW = (a.W + 1) / 2, G = a.C / kVec;
  T* pooled = static_cast<T*>(a.pooled) + size_t(n) * PH * PW * a.C;
  for (int i = tid; i < PH * PW * G; i += kThreads) {
    int g = i % G, q = (i / G) % PW, p = i / G / PW;
    float acc[kVec] = {};
    for (int dy = -1; dy <= 1; ++dy) {
      int y = 2 * p + dy;
      if (y < 0 || y >= a.H) continue;
      for (int dx = -1; dx <= 1; ++dx) {
        int x = 2 * q + dx;
        if (x < 0 || x >= a.W) continue;
        float v[kVec];
        load8(out + (size_t(y) * a.W + x) * a.C + g * kVec, v);
#pragma unroll
        for (int j = 0; j < kVec; ++j) acc[j] += v[j];
      }
    }
#pragma unroll
    for (int j = 0; j < kVec; ++j) acc[j] *= 1.f / 9.f;
    store8(pooled + size_t(i) * kVec, acc);
  }
}

}  // namespace

size_t se_gate_smem_bytes(int C, int R) { return sizeof(float) * (C + R + kThreads * kVec); }

int se_gate_max_channels() { return kThreads * kVec; }

cudaError_t launch_se_gate(SeGateArgs const& a, cudaStream_t stream) {
  size_t smem = se_gate_smem_bytes(a.C, a.R);
  if (a.dtype == DType::kF16) {
    if (smem > 48 * 1024)
      cudaFuncSetAttribute(se_gate_kernel<__half>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    se_gate_kernel<__half><<<a.N, kThreads, smem, stream>>>(a);
  } else {
    if (smem > 48 * 1024)
      cudaFuncSetAttribute(se_gate_kernel<__nv_bfloat16>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    se_gate_kernel<__nv_bfloat16><<<a.N, kThreads, smem, stream>>>(a);
  }
  return cudaGetLastError();
}

}  // namespace se_gate
}  // namespace cutlass_ops
