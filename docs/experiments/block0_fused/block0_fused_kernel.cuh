// One kernel for SE-ResNet9-FixUp's block 0 (16x16 maps, 64 -> 64 channels, stride 1, no
// downsample), fp16 NHWC in and out, float32 accumulation:
//
//   xa  = x + b1a
//   h1  = relu(conv1(xa) + b1b) + b2a            (conv2's input; both convs 3x3, pad 1)
//   h   = conv2(h1) * scale + b2b
//   g   = sigmoid(fc2(relu(fc1(mean_hw(h)))))    (SE, reduction 16: 64 -> 4 -> 64)
//   out = relu(h * g + x)
//
// (models/se_resnet.py's SEFixupBasicBlock.forward.)  Today FusedResNet runs this as three
// kernels (conv2d_fused, conv2d_fused, se_gate), each reading and writing the maps through
// HBM.  Here a persistent CTA (one per SM: it needs ~211 KB of shared memory) keeps both
// filters in shared memory and loops over whole images, so HBM sees each image's input once
// (32 KB) and its output once (32 KB).
//
// Shared memory (bytes):
//   W1, W2     2 x 64 x 576 fp16     147456   [k_out][tap*64 + c_in], 16-byte chunks XOR-swizzled
//   buf[0..1]  2 x 256 x 64 fp16      65536   one image's map each, NHWC, chunks swizzled; roles
//                                             alternate per image: "cur" holds the input (then
//                                             the output, in place), "mid" conv1's output and
//                                             then the next image's input (prefetched)
//   red        8 warps x 64 fp32       2048   per-warp channel sums (the SE squeeze)
//   mean/gate  64 + 64 fp32             512
//   hidden     8 fp32 (4 used)           32
//   zero       16 bytes                  16   ldmatrix reads it for rows in the zero padding
//   total                            215600   (opt-in limit: 232448 on sm_90, 166912 on sm_80)
//
// No halo is stored: the 3x3 padding is done by pointing the ldmatrix row address of a pixel
// outside the image at the 16 zero bytes, so a map takes exactly 32 KB.
//
// Implicit GEMM per conv: M = 256 pixels, N = 64 output channels, K = 9 taps x 64 channels = 576,
// K ordered (tap = r*3+s, channel): the weight's channels_last (KRSC) layout.  8 warps; warp w
// owns image rows 2w and 2w+1 (two m16 tiles, a tile = one image row of 16 pixels) and all 64
// output channels (eight n8 tiles): 64 fp32 accumulators per thread.  Per k16 step a warp
// issues 2 ldmatrix.x4 for A, 4 ldmatrix.x4 for B and 16 mma.sync.m16n8k16 (fp16 -> fp32).
// That is 24 KB of shared-memory reads per CTA per k16 step for 262144 MACs: at 128 B/clk
// the shared-memory pipe (192 clk) limits this first version more than the tensor cores
// (~128 clk at the dense peak).  wgmma (A and B read by the tensor cores from shared memory
// through descriptors, a 64-row tile per warpgroup, B read once per warpgroup instead of once
// per warp) is the step that removes that; TMA would replace the cp.async loops.
//
// Swizzle: a map row (one pixel, 64 channels) is 128 bytes = 8 chunks of 16 bytes; chunk c
// of pixel p is stored at chunk c ^ (p & 7).  ldmatrix reads 8 rows of 16 bytes per 8x8
// matrix; the 8 rows are 8 consecutive pixels (shifted by the tap), so the XOR puts them in 8
// different bank groups.  Weights: row n (576 halves = 72 chunks), chunk c at c ^ (n & 7)
// (72 is a multiple of 8, so the XOR stays inside the row); rows are 1152 bytes apart (a
// multiple of 128), the 8 rows of one ldmatrix matrix are 8 consecutive n.
#pragma once

#include <cuda_fp16.h>
#include <stdint.h>

namespace block0 {

constexpr int kC = 64;            // channels in = out
constexpr int kH = 16, kW = 16;   // map
constexpr int kPix = kH * kW;     // 256 GEMM rows per image
constexpr int kK = 9 * kC;        // 576
constexpr int kHidden = kC / 16;  // SE reduction 16
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;

constexpr int kWeightBytes = kC * kK * 2;      // 73728 per conv
constexpr int kMapBytes = kPix * kC * 2;       // 32768
constexpr int kOffW1 = 0;
constexpr int kOffW2 = kOffW1 + kWeightBytes;
constexpr int kOffBuf0 = kOffW2 + kWeightBytes;
constexpr int kOffBuf1 = kOffBuf0 + kMapBytes;
constexpr int kOffRed = kOffBuf1 + kMapBytes;
constexpr int kOffMean = kOffRed + kWarps * kC * 4;
constexpr int kOffGate = kOffMean + kC * 4;
constexpr int kOffHidden = kOffGate + kC * 4;
constexpr int kOffZero = kOffHidden + 8 * 4;
constexpr int kSmemBytes = kOffZero + 16;      // 215600
static_assert(kSmemBytes == 215600, "shared-memory budget changed: update the table above");
static_assert(kHidden <= kWarps, "one warp per SE hidden unit");

struct Params {
  const __half* x;      // [N, 16, 16, 64]
  __half* out;          // [N, 16, 16, 64]
  const __half* w1;     // [64, 3, 3, 64] (KRSC = channels_last of (K, C, R, S))
  const __half* w2;
  const float* b1a;     // FixUp scalars, one float each (read on the device: graph-safe)
  const float* b1b;
  const float* b2a;
  const float* scale;
  const float* b2b;
  const float* fc1_w;   // [4, 64]  (nn.Linear layouts)
  const float* fc1_b;   // [4]
  const float* fc2_w;   // [64, 4]
  const float* fc2_b;   // [64]
  int n;                // images
};

// ---- PTX wrappers (sm_80+ instructions; they run on sm_90) --------------------------------
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                            uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// D = A * B + D; A 16x16 row-major (4 regs), B 16x8 "col" (2 regs), D 16x8 fp32 (4 regs).
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t hadd2_u32(uint32_t a, uint32_t b) {
  __half2 r = __hadd2(*reinterpret_cast<__half2*>(&a), *reinterpret_cast<__half2*>(&b));
  return *reinterpret_cast<uint32_t*>(&r);
}

// Byte offset of (pixel, 16-byte chunk) in a swizzled map buffer.
__device__ __forceinline__ int map_offset(int pixel, int chunk) {
  return pixel * (kC * 2) + ((chunk ^ (pixel & 7)) << 4);
}
// Byte offset of (output channel n, 16-byte chunk of K) in a swizzled weight buffer.
__device__ __forceinline__ int weight_offset(int n, int chunk) {
  return n * (kK * 2) + ((chunk ^ (n & 7)) << 4);
}

// One image's map: global NHWC -> swizzled shared buffer (cp.async, 16 bytes per thread per step).
__device__ __forceinline__ void load_map_async(uint32_t buf, const __half* src) {
  const char* g = reinterpret_cast<const char*>(src);
#pragma unroll
  for (int q = threadIdx.x; q < kPix * 8; q += kThreads)
    cp_async_16(buf + map_offset(q >> 3, q & 7), g + q * 16);
}

__device__ __forceinline__ void load_weight_async(uint32_t buf, const __half* src) {
  const char* g = reinterpret_cast<const char*>(src);
  constexpr int kChunksPerRow = kK / 8;  // 72
  for (int q = threadIdx.x; q < kC * kChunksPerRow; q += kThreads)
    cp_async_16(buf + weight_offset(q / kChunksPerRow, q % kChunksPerRow), g + q * 16);
}

// One 3x3 conv of the map in `in` (swizzled smem) with weights `w` (swizzled smem):
// acc[mi][ni][e] for image row y = 2*warp + mi, pixel x = g (e = 0, 1) or g + 8 (e = 2, 3),
// output channel ni*8 + 2t + (e & 1), where g = lane / 4 and t = lane % 4 (the mma C layout).
// With kAddBias, `in_bias` (a half2 of b1a) is added to every A element inside the image
// (not to the zero padding): conv1 reads x and convolves x + b1a.
template <bool kAddBias>
__device__ __forceinline__ void conv3x3(float (&acc)[2][8][4], uint32_t in, uint32_t w, uint32_t zero,
                                        uint32_t in_bias) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 8; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.f;

  // A (ldmatrix.x4 of a 16x16 tile): lane l addresses row (l & 15) of the tile, i.e. pixel
  // x = l & 15 of the tile's image row, at K chunk 2*kc + (l >> 4).
  const int a_x = lane & 15;
  const int a_chunk_hi = lane >> 4;
  // B (ldmatrix.x4 of two n8 tiles x k16): matrix j = l >> 3; row n = np*16 + (l & 7) + (j >> 1)*8,
  // K chunk 2*kc + (j & 1).  Registers 0,1 are n-tile 2*np's (b0, b1), 2,3 n-tile 2*np+1's.
  const int b_n = (lane & 7) + ((lane >> 4) << 3);
  const int b_chunk_hi = (lane >> 3) & 1;
  // The A fragment rows this lane holds after ldmatrix: pixel x = g (regs 0, 2) and g + 8 (1, 3).
  const int g = lane >> 2;

#pragma unroll 1
  for (int tap = 0; tap < 9; ++tap) {
    const int r = tap / 3, s = tap % 3;
    // Per m-tile: the row address this lane gives ldmatrix (zero padding -> the zero chunk).
    // Swizzle term of the A address: (source pixel & 7) = (sx & 7); for the zero chunk every
    // lane of that row reads the same 16 bytes (no chunk offset, no XOR).
    const int sx = a_x + s - 1;
    const int a_swz = sx & 7;
    uint32_t a_row[2];
    bool a_pad[2];
    uint32_t bias_lo[2], bias_hi[2];  // b1a for fragment rows g and g + 8, or 0 in the padding
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
      const int sy = 2 * warp + mi + r - 1;
      const bool row_ok = sy >= 0 && sy < kH;
      a_pad[mi] = !(row_ok && sx >= 0 && sx < kW);
      a_row[mi] = a_pad[mi] ? zero : in + (sy * kW + sx) * (kC * 2);
      if (kAddBias) {
        bias_lo[mi] = (row_ok && g + s - 1 >= 0) ? in_bias : 0u;   // pixel x = g
        bias_hi[mi] = (row_ok && g + 8 + s - 1 < kW) ? in_bias : 0u;  // pixel x = g + 8
      }
    }

#pragma unroll
    for (int kc = 0; kc < 4; ++kc) {  // 4 k16 steps = the tap's 64 input channels
      const int a_chunk = ((2 * kc + a_chunk_hi) ^ a_swz) << 4;
      uint32_t a[2][4];
      ldmatrix_x4(a_row[0] + (a_pad[0] ? 0 : a_chunk), a[0][0], a[0][1], a[0][2], a[0][3]);
      ldmatrix_x4(a_row[1] + (a_pad[1] ? 0 : a_chunk), a[1][0], a[1][1], a[1][2], a[1][3]);
      if (kAddBias) {
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          a[mi][0] = hadd2_u32(a[mi][0], bias_lo[mi]);
          a[mi][2] = hadd2_u32(a[mi][2], bias_lo[mi]);
          a[mi][1] = hadd2_u32(a[mi][1], bias_hi[mi]);
          a[mi][3] = hadd2_u32(a[mi][3], bias_hi[mi]);
        }
      }
      const int k_chunk = (tap * 4 + kc) * 2 + b_chunk_hi;
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        const int n = np * 16 + b_n;
        uint32_t b0, b1, b2, b3;
        ldmatrix_x4(w + weight_offset(n, k_chunk), b0, b1, b2, b3);
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          mma_16816(acc[mi][2 * np], a[mi], b0, b1);
          mma_16816(acc[mi][2 * np + 1], a[mi], b2, b3);
        }
      }
    }
  }
}

__global__ void __launch_bounds__(kThreads, 1) block0_fused_kernel(Params p) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const uint32_t s_base = smem_addr(smem);
  const uint32_t s_w1 = s_base + kOffW1, s_w2 = s_base + kOffW2, s_zero = s_base + kOffZero;
  float* red = reinterpret_cast<float*>(smem + kOffRed);
  float* mean = reinterpret_cast<float*>(smem + kOffMean);
  float* gate = reinterpret_cast<float*>(smem + kOffGate);
  float* hidden = reinterpret_cast<float*>(smem + kOffHidden);

  int img = blockIdx.x;
  if (img >= p.n) return;

  // Once per CTA: both filters (144 KB), the zero chunk, the first image.
  if (tid < 4) reinterpret_cast<uint32_t*>(smem + kOffZero)[tid] = 0u;
  load_weight_async(s_w1, p.w1);
  load_weight_async(s_w2, p.w2);
  int cur = 0;  // which of buf[0], buf[1] holds this image's input
  load_map_async(s_base + kOffBuf0, p.x + (size_t)img * kPix * kC);
  cp_async_commit();

  const float b1b = *p.b1b, b2a = *p.b2a, scale = *p.scale, b2b = *p.b2b;
  const __half2 b1a_h2 = __float2half2_rn(*p.b1a);
  const uint32_t b1a_u32 = *reinterpret_cast<const uint32_t*>(&b1a_h2);

  float acc[2][8][4];
  for (; img < p.n; img += gridDim.x) {
    const uint32_t s_cur = s_base + (cur ? kOffBuf1 : kOffBuf0);
    const uint32_t s_mid = s_base + (cur ? kOffBuf0 : kOffBuf1);
    unsigned char* cur_ptr = smem + (cur ? kOffBuf1 : kOffBuf0);
    unsigned char* mid_ptr = smem + (cur ? kOffBuf0 : kOffBuf1);
    // The input has landed; the previous image's output copy out of `mid` is finished.
    cp_async_wait_all();
    __syncthreads();

    // ---- conv1: h1 = relu(conv1(x + b1a) + b1b) + b2a -> mid (fp16, conv2's padded input) ----
    conv3x3<true>(acc, s_cur, s_w1, s_zero, b1a_u32);
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
      const int pix = (2 * warp + mi) * kW + g;
#pragma unroll
      for (int ni = 0; ni < 8; ++ni) {
        const int byte_in_chunk = t * 4;  // channel ni*8 + 2t: chunk ni, 2t halves in
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
          const float v0 = fmaxf(acc[mi][ni][2 * hi] + b1b, 0.f) + b2a;
          const float v1 = fmaxf(acc[mi][ni][2 * hi + 1] + b1b, 0.f) + b2a;
          *reinterpret_cast<__half2*>(mid_ptr + map_offset(pix + 8 * hi, ni) + byte_in_chunk) =
              __floats2half2_rn(v0, v1);
        }
      }
    }
    __syncthreads();

    // ---- conv2: h = conv2(h1) * scale + b2b, kept in registers ----
    conv3x3<false>(acc, s_mid, s_w2, s_zero, 0u);
    // SE squeeze: this lane's column sums over its 4 rows, then over the 8 lanes of equal t.
    float colsum[8][2];
#pragma unroll
    for (int ni = 0; ni < 8; ++ni)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        float s = 0.f;
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          acc[mi][ni][j] = acc[mi][ni][j] * scale + b2b;
          acc[mi][ni][j + 2] = acc[mi][ni][j + 2] * scale + b2b;
          s += acc[mi][ni][j] + acc[mi][ni][j + 2];
        }
#pragma unroll
        for (int off = 4; off < 32; off <<= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
        colsum[ni][j] = s;
      }
    if (g == 0) {
#pragma unroll
      for (int ni = 0; ni < 8; ++ni) {
        red[warp * kC + ni * 8 + 2 * t] = colsum[ni][0];
        red[warp * kC + ni * 8 + 2 * t + 1] = colsum[ni][1];
      }
    }
    __syncthreads();  // every warp is past conv2's reads of `mid`, and `red` is complete

    // Prefetch the next image into `mid` (its role: next iteration's `cur`), overlapping the
    // squeeze/excite, the gate and the output copy.
    if (img + (int)gridDim.x < p.n) {
      load_map_async(s_mid, p.x + (size_t)(img + gridDim.x) * kPix * kC);
      cp_async_commit();
    }

    // ---- SE excite: mean -> fc1 -> ReLU -> fc2 -> sigmoid (64 -> 4 -> 64, float32) ----
    if (tid < kC) {
      float s = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) s += red[w * kC + tid];
      mean[tid] = s * (1.f / kPix);
    }
    __syncthreads();
    if (warp < kHidden) {
      float s = __ldg(p.fc1_w + warp * kC + lane) * mean[lane] +
                __ldg(p.fc1_w + warp * kC + lane + 32) * mean[lane + 32];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
      if (lane == 0) hidden[warp] = fmaxf(s + __ldg(p.fc1_b + warp), 0.f);
    }
    __syncthreads();
    if (tid < kC) {
      float s = __ldg(p.fc2_b + tid);
#pragma unroll
      for (int j = 0; j < kHidden; ++j) s += __ldg(p.fc2_w + tid * kHidden + j) * hidden[j];
      gate[tid] = 1.f / (1.f + __expf(-s));
    }
    __syncthreads();

    // ---- gate, residual, ReLU: out = relu(h * g + x), in place over x in `cur` ----
    // (Each thread reads and writes the same 4 bytes: no hazard between threads.)
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
      const int pix = (2 * warp + mi) * kW + g;
#pragma unroll
      for (int ni = 0; ni < 8; ++ni) {
        const int c = ni * 8 + 2 * t;
        const float g0 = gate[c], g1 = gate[c + 1];
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
          __half2* px = reinterpret_cast<__half2*>(cur_ptr + map_offset(pix + 8 * hi, ni) + t * 4);
          const float2 xv = __half22float2(*px);
          const float o0 = fmaxf(acc[mi][ni][2 * hi] * g0 + xv.x, 0.f);
          const float o1 = fmaxf(acc[mi][ni][2 * hi + 1] * g1 + xv.y, 0.f);
          *px = __floats2half2_rn(o0, o1);
        }
      }
    }
    __syncthreads();

    // ---- one coalesced write of the output: 16 bytes per thread per step ----
    {
      char* dst = reinterpret_cast<char*>(p.out + (size_t)img * kPix * kC);
#pragma unroll
      for (int q = tid; q < kPix * 8; q += kThreads)
        *reinterpret_cast<uint4*>(dst + q * 16) =
            *reinterpret_cast<const uint4*>(cur_ptr + map_offset(q >> 3, q & 7));
    }
    cur ^= 1;  // the prefetched image becomes `cur`; this image's buffer becomes `mid`
  }
}

}  // namespace block0
