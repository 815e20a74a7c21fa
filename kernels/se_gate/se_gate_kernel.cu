#include "se_gate/se_gate_kernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace cutlass_ops {
namespace se_gate {

namespace {

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

// One CTA per kImages consecutive images (more than one when there are plenty of
// CTAs: the excite weights are then read once per group, not once per image).
template <typename T, int kImages>
__global__ void __launch_bounds__(kThreads) se_gate_kernel(SeGateArgs a) {
  extern __shared__ float smem[];
  int const n0 = blockIdx.x * kImages;
  int const images = min(kImages, a.N - n0);  // the last CTA may have fewer
  float* gate = smem;                       // [images][C]: channel sums, then the gate
  float* hidden = smem + kImages * a.C;     // [images][R]
  float* partial = hidden + kImages * a.R;  // [kThreads][kVec]
  int const tid = threadIdx.x;
  int const HW = a.H * a.W;
  size_t const base = size_t(n0) * HW * a.C;
  T const* h = static_cast<T const*>(a.h) + base;
  T const* idn = static_cast<T const*>(a.identity) + base;
  T* out = static_cast<T*>(a.out) + base;

  // Squeeze, deterministically (no atomics: the same input gives the same bits, graph or
  // not).  Thread t owns the 8 channels of group t % G (G = C/8 groups per pixel) and
  // strides over an image's pixels; the per-thread partials are then summed in a fixed order.
  int const G = a.C / kVec;
  int const rows_per_pass = kThreads / G;  // >= 1: the op guarantees C <= 8 * kThreads
  for (int img = 0; img < images; ++img) {
    int const g = tid % G, row0 = tid / G;
    float acc[kVec] = {};
    if (row0 < rows_per_pass) {
      T const* hi = h + size_t(img) * HW * a.C;
      for (int p = row0; p < HW; p += rows_per_pass) {
        float v[kVec];
        load8(hi + (size_t(p) * a.C + g * kVec), v);
#pragma unroll
        for (int j = 0; j < kVec; ++j) acc[j] += v[j];
      }
    }
#pragma unroll
    for (int j = 0; j < kVec; ++j) partial[tid * kVec + j] = acc[j];
    __syncthreads();
    for (int c = tid; c < a.C; c += kThreads) {
      float s = 0.f;
      for (int r = 0; r < rows_per_pass; ++r) s += partial[(r * G + c / kVec) * kVec + c % kVec];
      gate[img * a.C + c] = s;
    }
    __syncthreads();
  }

  // Excite, first Linear + ReLU: one warp per hidden unit, lanes over channels; each W1
  // element is loaded once for all of the CTA's images.
  float const inv_hw = 1.f / HW;
  int const warp = tid / 32, lane = tid % 32;
  for (int r = warp; r < a.R; r += kThreads / 32) {
    float dot[kImages] = {};
#pragma unroll 4
    for (int c = lane; c < a.C; c += 32) {
      float w = a.w1[size_t(r) * a.C + c];
#pragma unroll
      for (int i = 0; i < kImages; ++i)
        if (i < images) dot[i] += w * gate[i * a.C + c];
    }
#pragma unroll
    for (int i = 0; i < kImages; ++i) {
      if (i >= images) break;
      float d = dot[i];
      for (int off = 16; off > 0; off /= 2) d += __shfl_xor_sync(0xffffffffu, d, off);
      if (lane == 0) hidden[i * a.R + r] = fmaxf(d * inv_hw + a.b1[r], 0.f);
    }
  }
  __syncthreads();  // hidden is complete, and every read of the sums is done

  // Second Linear + sigmoid: one thread per channel.  Its loads of a W2 row are
  // independent, so unrolling keeps several in flight (latency, not bandwidth, limits this
  // phase: W2 is small and L2-resident); each is used for all of the CTA's images.  The
  // gate overwrites the sums.
  for (int c = tid; c < a.C; c += kThreads) {
    float const* row = a.w2 + size_t(c) * a.R;
    float dot[kImages] = {};
#pragma unroll 8
    for (int r = 0; r < a.R; ++r) {
      float w = row[r];
#pragma unroll
      for (int i = 0; i < kImages; ++i)
        if (i < images) dot[i] += w * hidden[i * a.R + r];
    }
#pragma unroll
    for (int i = 0; i < kImages; ++i)
      if (i < images) gate[i * a.C + c] = 1.f / (1.f + __expf(-(dot[i] + a.b2[c])));
  }
  __syncthreads();

  // Gate, residual, ReLU, the next block's input bias: the CTA's images are contiguous.
  float const idn_bias = a.identity_bias ? *a.identity_bias : 0.f;
  float const post = a.post_bias ? *a.post_bias : 0.f;
  int const groups_per_image = HW * G;
  for (int i = tid; i < images * groups_per_image; i += kThreads) {
    int const img = i / groups_per_image;
    int const c0 = (i % G) * kVec;
    float hv[kVec], iv[kVec], o[kVec];
    load8(h + size_t(i) * kVec, hv);
    load8(idn + size_t(i) * kVec, iv);
    float const* gi = gate + img * a.C + c0;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      float v = hv[j] * gi[j] + iv[j] + idn_bias;
      o[j] = (v < 0.f ? 0.f : v) + post;  // keeps NaN, like torch.relu
    }
    store8(out + size_t(i) * kVec, o);
  }
  if (a.pooled == nullptr) return;

  // AvgPool2d(3, 2, 1, count_include_pad=True) of these images' (rounded) output, read
  // back from global memory: a block's own writes are visible to it after __syncthreads.
  __syncthreads();
  int const PH = (a.H + 1) / 2, PW = (a.W + 1) / 2;
  T* pooled = static_cast<T*>(a.pooled) + size_t(n0) * PH * PW * a.C;
  for (int i = tid; i < images * PH * PW * G; i += kThreads) {
    int g = i % G, q = (i / G) % PW, p = (i / G / PW) % PH, img = i / G / PW / PH;
    T const* oi = out + size_t(img) * HW * a.C;
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

template <int kImages>
cudaError_t launch_typed(SeGateArgs const& a, cudaStream_t stream) {
  size_t smem = se_gate_smem_bytes(a.C, a.R, kImages);
  unsigned grid = static_cast<unsigned>((a.N + kImages - 1) / kImages);
  auto kernel = a.dtype == DType::kF16 ? se_gate_kernel<__half, kImages> : se_gate_kernel<__nv_bfloat16, kImages>;
  if (smem > 48 * 1024) {
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (err != cudaSuccess) return err;
  }
  kernel<<<grid, kThreads, smem, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

size_t se_gate_smem_bytes(int C, int R, int images_per_cta) {
  return sizeof(float) * (images_per_cta * (C + R) + kThreads * kVec);
}

int se_gate_max_channels() { return kThreads * kVec; }

int se_gate_images_per_cta(int N, int H, int W, int C, int R, int num_sms) {
  // Group images while a group has fewer 8-channel vectors than two per thread (few
  // pixels, many channels: reading the excite weights then dominates), while at least
  // two CTAs per SM remain and shared memory stays small.
  int const vectors_per_image = H * W * C / kVec;
  int images = 1;
  while (images < kMaxImagesPerCta && images * vectors_per_image < 2 * kThreads &&
         N / (2 * images) >= 2 * num_sms && se_gate_smem_bytes(C, R, 2 * images) <= 64 * 1024) {
    images *= 2;
  }
  return images;
}

cudaError_t launch_se_gate(SeGateArgs const& a, int images_per_cta, cudaStream_t stream) {
  switch (images_per_cta) {
    case 1: return launch_typed<1>(a, stream);
    case 2: return launch_typed<2>(a, stream);
    case 4: return launch_typed<4>(a, stream);
    case 8: return launch_typed<8>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace se_gate
}  // namespace cutlass_ops
