// fp16/bf16 <-> float (float <-> float too, for kernels templated on either), and a small
// vector of consecutive 16-bit elements loaded or stored as one 16-byte access (kVec == 8),
// or element by element (kVec == 1: unaligned or odd sizes).
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

inline bool aligned16(void const* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

}  // namespace cutlass_ops
