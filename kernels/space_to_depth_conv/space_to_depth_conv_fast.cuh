// The sm80+ forward stem kernel's device code (the launcher is space_to_depth_conv_kernel.cu;
// tests/cuda_emulator/stem_harness.cpp runs it on the CPU).  Persistent and warp-independent:
// each warp owns 16-pixel tiles (tile = global warp id + k * warps in the grid) and a private
// ring of kStages staging slots that cp.async fills kStages - 1 tiles ahead, so the input
// reads of later tiles overlap this tile's MMAs and stores.  No CTA barrier after the weights.
//
// The GEMM's k order is permuted so that a staged input row is an MMA fragment as is: k-chunk
// c (16 columns) is input channel c, and within it column 2t+j is (dy=t, dx=j), 8+2t+j is
// (dy=t, dx=2+j).  Lane (g, t) of mma.m16n8k16 then needs, for pixel g (and g+8), the 4
// contiguous inputs x[c][4p+t][4q..4q+3]: one 8-byte shared load.  The weight is re-indexed
// the same way once per CTA.  Accumulators go straight from registers to global memory: a
// quad transposes its packed words so that each lane stores 16 bytes.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "space_to_depth_conv/space_to_depth_patches.cuh"

namespace cutlass_ops {
namespace space_to_depth_conv {
namespace fast {

constexpr int kTileM = 16;     // pixels per warp tile: one m16 row block
constexpr int kStages = 4;     // staging slots per warp: 3 tiles in flight while one computes
constexpr int kMaxWarps = 8;   // warps per CTA (fewer where shared memory is short)
constexpr int kRowBytes = 160; // a staged (c, dy) row: 16 pixels x 4 dx x 2 B, padded so the
                               // fragment loads (rows t, pixels g) hit distinct banks

// How a tile's inputs are read: 16-byte cp.async of two pixels' 4 dx (unit-stride rows, even
// Q, 16-byte aligned), 8-byte cp.async of one pixel's (8-byte aligned), or element loads.
enum LoadMode : int { kScalar = 0, kVec8 = 1, kVec16 = 2 };

struct FastParams {
  void const* input;
  void const* weight;  // (K, 16C) row-major
  void* output;        // (M, K)
  float const* post_bias;
  int64_t stride_n, stride_c, stride_h, stride_w;
  int C, P, Q, M;  // M = N * P * Q output pixels
  int warps;       // per CTA (blockDim.x / 32)
  int mode;        // LoadMode
  bool relu;
};

__host__ __device__ inline size_t weight_smem_bytes(int C, int K) { return size_t(K) * 16 * C * 2; }
__host__ __device__ inline size_t stage_bytes(int C) { return size_t(C) * kBlock * kRowBytes; }
__host__ __device__ inline size_t smem_bytes(int C, int K, int warps) {
  return weight_smem_bytes(C, K) + size_t(warps) * kStages * stage_bytes(C);
}

#ifndef CUTLASS_OPS_STEM_EMULATED
// cp.async of `bytes` (8 or 16), zero-filled when !valid (then nothing is read).
template <int kBytes>
__device__ __forceinline__ void copy_async(void* smem_dst, void const* gmem_src, bool valid) {
  unsigned const dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  int const n = valid ? kBytes : 0;
  if constexpr (kBytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src), "r"(n) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(gmem_src), "r"(n) : "memory");
  }
}
__device__ __forceinline__ void copy_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void copy_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}
// d += a * b, m16n8k16, fp32 accumulate.
template <typename T>
__device__ __forceinline__ void mma16816(float* d, uint32_t const* a, uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same<T, __half>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}
__device__ __forceinline__ uint32_t shfl_xor_u32(uint32_t v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }
#endif

template <typename T> struct Pack;
template <> struct Pack<__half> {
  static __device__ __forceinline__ uint32_t f2(float a, float b) {
    __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&h);
  }
};
template <> struct Pack<__nv_bfloat16> {
  static __device__ __forceinline__ uint32_t f2(float a, float b) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&h);
  }
};

// Element offset of output pixel m's top-left input x[n][0][4p][4q].
__device__ __forceinline__ int64_t pixel_offset(FastParams const& p, int m) {
  int const pq = p.P * p.Q;
  int const n = m / pq, r = m - n * pq, row = r / p.Q, q = r - row * p.Q;
  return n * p.stride_n + int64_t(kBlock * row) * p.stride_h + int64_t(kBlock * q) * p.stride_w;
}

// Starts (or, kScalar, does) the loads of tile `tile` into `slot`: row (c, dy) holds pixels
// 0..15's x[c][4p+dy][4q..4q+3], 8 bytes each; pixels past M zero.
__device__ __forceinline__ void load_tile(FastParams const& p, int tile, unsigned char* slot, int lane) {
  uint16_t const* x = static_cast<uint16_t const*>(p.input);
  int const m0 = tile * kTileM;
  if (p.mode == kVec16) {  // lane: pixel pair lane % 8, row dy = lane / 8; M is even here
    int const pair = lane & 7, dy = lane >> 3, m = m0 + 2 * pair;
    bool const valid = m < p.M;
    uint16_t const* src = x + (valid ? pixel_offset(p, m) + dy * p.stride_h : 0);
    unsigned char* dst = slot + dy * kRowBytes + pair * 16;
    for (int c = 0; c < p.C; ++c) {
      copy_async<16>(dst + c * (kBlock * kRowBytes), valid ? src + c * p.stride_c : x, valid);
    }
  } else {  // lane: pixel lane % 16, rows dy and dy + 2 with dy = lane / 16
    int const px = lane & 15, dy = lane >> 4, m = m0 + px;
    bool const valid = m < p.M;
    uint16_t const* src = x + (valid ? pixel_offset(p, m) + dy * p.stride_h : 0);
    unsigned char* dst = slot + dy * kRowBytes + px * 8;
    for (int c = 0; c < p.C; ++c) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        int64_t const off = c * p.stride_c + 2 * h * p.stride_h;
        unsigned char* d = dst + c * (kBlock * kRowBytes) + 2 * h * kRowBytes;
        if (p.mode == kVec8) {
          copy_async<8>(d, valid ? src + off : x, valid);
        } else {
          uint32_t lo = 0, hi = 0;
          if (valid) {
            uint16_t const* s = src + off;
            lo = uint32_t(s[0]) | (uint32_t(s[p.stride_w]) << 16);
            hi = uint32_t(s[2 * p.stride_w]) | (uint32_t(s[3 * p.stride_w]) << 16);
          }
          *reinterpret_cast<uint2*>(d) = make_uint2(lo, hi);
        }
      }
    }
  }
}

// The weight in fragment order: for chunk c and n-tile pair jp, lane (g, t) reads one uint4 =
// {b0, b1} of n-tile 2jp then of 2jp+1, where b0 = (dy=t, dx=0,1), b1 = (dy=t, dx=2,3) of
// output channel 8 * ntile + g.
template <int K>
__device__ __forceinline__ void load_weight(FastParams const& p, uint4* wf, int tid, int threads) {
  uint16_t const* w = static_cast<uint16_t const*>(p.weight);
  int const C = p.C, KC = 16 * C;
  for (int i = tid; i < C * (K / 16) * 32; i += threads) {
    int const lane = i & 31, jp = (i >> 5) % (K / 16), c = (i >> 5) / (K / 16);
    int const g = lane >> 2, t = lane & 3;
    uint32_t v[4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint16_t const* src = w + (16 * jp + 8 * h + g) * KC + t * 4 * C + c;  // (dy=t, dx=0, c)
      v[2 * h] = uint32_t(src[0]) | (uint32_t(src[C]) << 16);
      v[2 * h + 1] = uint32_t(src[2 * C]) | (uint32_t(src[3 * C]) << 16);
    }
    wf[i] = make_uint4(v[0], v[1], v[2], v[3]);
  }
}

// Lane t of a quad holds word t of n-tiles k = 0..3 (v[k]); afterwards word k of n-tile t.
__device__ __forceinline__ void quad_transpose(uint32_t* v, int t) {
  bool const odd = t & 1, upper = t & 2;
#pragma unroll
  for (int k = 0; k < 4; k += 2) {
    uint32_t const r = shfl_xor_u32(odd ? v[k] : v[k + 1], 1);
    if (odd) v[k] = r; else v[k + 1] = r;
  }
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    uint32_t const r = shfl_xor_u32(upper ? v[k] : v[k + 2], 2);
    if (upper) v[k] = r; else v[k + 2] = r;
  }
}

// MMAs over the C chunks of one staged tile, then act + post_bias, one rounding, stores.
template <typename T, int K>
__device__ __forceinline__ void compute_tile(FastParams const& p, unsigned char const* slot, uint4 const* wf,
                                             int tile, int lane, float post) {
  constexpr int kN = K / 8;  // n-tiles
  int const g = lane >> 2, t = lane & 3;
  float acc[kN][4];
#pragma unroll
  for (int j = 0; j < kN; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  for (int c = 0; c < p.C; ++c) {
    unsigned char const* row = slot + (c * kBlock + t) * kRowBytes;
    uint2 const lo = *reinterpret_cast<uint2 const*>(row + g * 8);        // pixel g
    uint2 const hi = *reinterpret_cast<uint2 const*>(row + (g + 8) * 8);  // pixel g + 8
    uint32_t const a[4] = {lo.x, hi.x, lo.y, hi.y};
    uint4 const* wc = wf + c * (K / 16) * 32 + lane;
#pragma unroll
    for (int jp = 0; jp < K / 16; ++jp) {
      uint4 const b = wc[jp * 32];
      mma16816<T>(acc[2 * jp], a, b.x, b.y);
      mma16816<T>(acc[2 * jp + 1], a, b.z, b.w);
    }
  }
  T* out = static_cast<T*>(p.output);
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // rows g and g + 8
    int const m = tile * kTileM + g + 8 * h;
    uint32_t words[kN];
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      float v0 = acc[j][2 * h], v1 = acc[j][2 * h + 1];
      if (p.relu) {  // keeps NaN, like torch.relu
        v0 = v0 < 0.f ? 0.f : v0;
        v1 = v1 < 0.f ? 0.f : v1;
      }
      words[j] = Pack<T>::f2(v0 + post, v1 + post);
    }
#pragma unroll
    for (int b = 0; b < kN / 4; ++b) quad_transpose(words + 4 * b, t);
    if (m < p.M) {
#pragma unroll
      for (int b = 0; b < kN / 4; ++b) {
        *reinterpret_cast<uint4*>(out + size_t(m) * K + 8 * (4 * b + t)) =
            make_uint4(words[4 * b], words[4 * b + 1], words[4 * b + 2], words[4 * b + 3]);
      }
    }
  }
}

// The kernel body after wait_for_previous_grid(); smem: the weight in fragment order, then
// each warp's kStages slots.
template <typename T, int K>
__device__ __forceinline__ void fast_body(FastParams const& p, unsigned char* smem, int tid) {
  int const warp = tid >> 5, lane = tid & 31;
  uint4* wf = reinterpret_cast<uint4*>(smem);
  size_t const slot_bytes = stage_bytes(p.C);
  unsigned char* ring = smem + weight_smem_bytes(p.C, K) + warp * kStages * slot_bytes;
  int const tiles = (p.M + kTileM - 1) / kTileM;
  int const first = blockIdx.x * p.warps + warp, step = gridDim.x * p.warps;

  // The first kStages - 1 tiles' loads (one group each, empty past the last tile, so that
  // the wait below always leaves the newest kStages - 1 groups pending) before the weight.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    int const tile = first + s * step;
    if (tile < tiles) load_tile(p, tile, ring + s * slot_bytes, lane);
    copy_async_commit();
  }
  load_weight<K>(p, wf, tid, 32 * p.warps);
  float const post = p.post_bias ? *p.post_bias : 0.f;
  __syncthreads();  // the weight; from here on the warps are independent

  int slot = 0;
  for (int tile = first; tile < tiles; tile += step) {
    int const ahead = tile + (kStages - 1) * step;
    int const ahead_slot = slot == 0 ? kStages - 1 : slot - 1;  // last read one tile ago
    if (ahead < tiles) load_tile(p, ahead, ring + ahead_slot * slot_bytes, lane);
    copy_async_commit();
    copy_async_wait<kStages - 1>();  // this tile's group has landed (this lane's copies)
    __syncwarp();                    // ... and every lane's
    compute_tile<T, K>(p, ring + slot * slot_bytes, wf, tile, lane, post);
    __syncwarp();  // all lanes are done with `slot` before the next iteration refills it
    slot = slot == kStages - 1 ? 0 : slot + 1;
  }
  copy_async_wait<0>();
}

}  // namespace fast
}  // namespace space_to_depth_conv
}  // namespace cutlass_ops
