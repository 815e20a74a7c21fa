// fp16/bf16 <-> float (float <-> float too, for kernels templated on either), and a small
// vector of consecutive 16-bit elements loaded or stored as one 16-byte access (kVec == 8),
// or element by element (kVec == 1: unaligned or odd sizes); load_floats/store_floats for
// any vector length and element type.
// Shared by the hand-written elementwise kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace cutlass_ops {

__device__ inline float to_float(float v) { return v; }
__device__ inline float to_float(__half v) { return __half2float(v); }
__device__ inline float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ inline T from_float(float v);
template <> __device__ inline float from_float<float>(float v) { return v; }
template <> __device__ inline __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

template <typename T, int kVec>
struct HalfChunk {
  static_assert(kVec == 1 || kVec == 8, "one element, or 8 (16 bytes)");
  T v[kVec];
  __device__ void load(T const* p) {
    if (kVec == 8) {
      *reinterpret_cast<uint4*>(v) = *reinterpret_cast<uint4 const*>(p);
    } else {
      v[0] = p[0];
    }
  }
  __device__ void store(T* p) const {
    if (kVec == 8) {
      *reinterpret_cast<uint4*>(p) = *reinterpret_cast<uint4 const*>(v);
    } else {
      p[0] = v[0];
    }
  }
};

// kVec consecutive elements of any of the types above as floats: whole 16-byte accesses
// when kVec * sizeof(T) is a multiple of 16 (p then 16-byte aligned), else one at a time.
template <int kVec, typename T>
__device__ inline void load_floats(T const* p, float (&out)[kVec]) {
  if constexpr (kVec * sizeof(T) % 16 == 0) {
    uint4 raw[kVec * sizeof(T) / 16];
#pragma unroll
    for (int w = 0; w < int(kVec * sizeof(T) / 16); ++w) raw[w] = reinterpret_cast<uint4 const*>(p)[w];
    T const* e = reinterpret_cast<T const*>(raw);
#pragma unroll
    for (int k = 0; k < kVec; ++k) out[k] = to_float(e[k]);
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k) out[k] = to_float(p[k]);
  }
}

template <int kVec, typename T>
__device__ inline void store_floats(T* p, float const (&v)[kVec]) {
  if constexpr (kVec * sizeof(T) % 16 == 0) {
    uint4 raw[kVec * sizeof(T) / 16];
    T* e = reinterpret_cast<T*>(raw);
#pragma unroll
    for (int k = 0; k < kVec; ++k) e[k] = from_float<T>(v[k]);
#pragma unroll
    for (int w = 0; w < int(kVec * sizeof(T) / 16); ++w) reinterpret_cast<uint4*>(p)[w] = raw[w];
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k) p[k] = from_float<T>(v[k]);
  }
}

inline bool aligned16(void const* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// Element i of a parameter (weight, bias) stored as float32 (f32) or as T, as a float: a 16-bit
// model's own parameters are read without a cast kernel per call.  f32 is uniform per launch.
template <typename T>
__device__ __forceinline__ float load_param(void const* p, long long i, bool f32) {
  return f32 ? static_cast<float const*>(p)[i] : to_float(static_cast<T const*>(p)[i]);
}

}  // namespace cutlass_ops
