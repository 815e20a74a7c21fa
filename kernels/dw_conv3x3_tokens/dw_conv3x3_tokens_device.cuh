// The depthwise conv kernel (dw_conv3x3_tokens_kernel.h), torch-free and launch-free so that the CPU
// emulator can run it too (tests/python/test_dw_conv.py).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "common/half_chunk.cuh"
#include "dw_conv3x3_tokens/dw_conv3x3_tokens_kernel.h"

namespace cutlass_ops {
namespace dw_conv {

constexpr int kThreads = 256;
// Input pixels along a row per thread: even, so that stride-2 centres stay even; timed on an
// H200 over CvT-13's depthwise convs, strips of 8 beat 4 and 2.
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

// ---- The tiled forward kernel (dw_conv_tile_kernel) ---------------------------------------------
//
// One CTA per (image, band of `rows` input rows, slice of up to kTileChunks 8-channel chunks):
// the band with a row and a column of halo on each side goes into shared memory once, zeros
// outside the map (16-byte copies, asynchronous on sm80+), then every projection's outputs
// centred in the band are computed from there.  The strip kernel above loads each input
// element about 7 times through L1 (every projection its own windows) and converts each
// element and tap to float at every use; here a thread keeps its chunk's 72 taps as floats and
// slides along a row of outputs one new window column (3 pixels x 8 channels) at a time, each
// converted once and added to the 3 outputs it touches (2 at stride 2).
constexpr int kTileThreads = 128;
constexpr int kTileChunks = 8;          // 64 channels: a warp's 16-byte reads cover whole pixels
constexpr int kTileStrip = 8;           // outputs along a row per work item
constexpr int kTileMaxBytes = 64 * 1024;  // three CTAs an SM (128 threads, <= 170 registers each)

struct TileShape {
  int rows;     // input rows a CTA centres its outputs on (even: stride-2 rows line up)
  int chunks;   // 8-channel chunks per slice
  int bands;    // ceil(h / rows)
  int slices;   // ceil((c / 8) / chunks)
};

__host__ __device__ inline long long tile_bytes(int rows, int w, int chunks) {
  return static_cast<long long>(rows + 2) * (w + 2) * chunks * 16;
}

// Shared memory the tiled kernel's LayerNorm takes after the band (a.layer_norm): each band
// pixel's (mean, rstd) and the LayerNorm's weight and bias as floats.
__host__ __device__ inline long long layer_norm_bytes(DwConvArgs const& a, int rows) {
  return a.layer_norm ? static_cast<long long>(rows + 2) * (a.w + 2) * 8 + 8LL * a.c : 0;
}

// The tiled kernel's shape for a 16-byte-vector launch (dw_conv_vec == 8), or rows == 0 where
// its band does not fit shared memory (maps wider than ~120 pixels; the strip kernel then).
// The band is as tall as shared memory allows, then halved (to 2 rows) until the grid fills
// `min_ctas` CTAs: small batches get more, shorter bands.
// With layer_norm a slice holds every channel (a pixel's statistics need them all).
inline TileShape dw_tile_shape(DwConvArgs const& a, long long min_ctas, long long max_bytes = kTileMaxBytes) {
  TileShape s{0, 0, 0, 0};
  s.chunks = a.layer_norm || a.c / 8 < kTileChunks ? a.c / 8 : kTileChunks;
  auto bytes = [&](int rows) { return tile_bytes(rows, a.w, s.chunks) + layer_norm_bytes(a, rows); };
  if (s.chunks == 0 || s.chunks > kTileThreads || bytes(2) > max_bytes) return s;
  s.slices = (a.c / 8 + s.chunks - 1) / s.chunks;
  int rows = a.h + (a.h & 1);
  while (rows > 2 && bytes(rows) > max_bytes) rows -= 2;
  while (rows > 2 && a.n * s.slices * ((a.h + rows - 1) / rows) < min_ctas) rows = ((rows / 2) + 1) & ~1;
  s.rows = rows;
  s.bands = (a.h + rows - 1) / rows;
  return s;
}

// 16 bytes global -> shared, zeros where !valid (src then unread).
__device__ __forceinline__ void copy16_or_zero(uint4* dst, void const* src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 16 : 0));
#else
  *dst = valid ? *static_cast<uint4 const*>(src) : make_uint4(0, 0, 0, 0);
#endif
}

__device__ __forceinline__ void copies_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;\n" ::);
#endif
}

// A chunk's 72 taps (w(e * 9 + t)) as floats; 16-bit ones as nine 16-byte loads (the
// launcher's 16-byte path has the weight aligned: dw_conv_vec).
template <typename T>
__device__ __forceinline__ void load_taps(DwConvArgs const& a, long long first, float (&w)[72]) {
  if (a.params_f32) {
#pragma unroll
    for (int f = 0; f < 72; ++f) w[f] = static_cast<float const*>(a.weight)[first + f];
  } else {
#pragma unroll
    for (int k = 0; k < 9; ++k) {
      HalfChunk<T, 8> v;
      v.load(static_cast<T const*>(a.weight) + first + 8 * k);
#pragma unroll
      for (int e = 0; e < 8; ++e) w[8 * k + e] = to_float(v.v[e]);
    }
  }
}

// 8 channels of 3 window rows at one shared-memory column, as floats.
template <typename T>
__device__ __forceinline__ void load_window_column(uint4 const* const (&row)[3], int col, int chunks, float (&v)[3][8]) {
#pragma unroll
  for (int ky = 0; ky < 3; ++ky) {
    uint4 raw = row[ky][col * chunks];
    T const* e = reinterpret_cast<T const*>(&raw);
#pragma unroll
    for (int k = 0; k < 8; ++k) v[ky][k] = to_float(e[k]);
  }
}

// acc[e] (+)= sum over ky of column[ky][e] * tap (ky, kx)
template <bool kStart>
__device__ __forceinline__ void add_column(float (&acc)[8], float const (&col)[3][8], float const (&w)[72],
                                           float const (&bias)[8], int kx) {
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    float s = kStart ? bias[e] : acc[e];
#pragma unroll
    for (int ky = 0; ky < 3; ++ky) s += col[ky][e] * w[e * 9 + ky * 3 + kx];
    acc[e] = s;
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// LayerNorm of one row of c channels by one warp (a.layer_norm): src -> each dst (null ones
// skipped), layer_norm_rows's arithmetic (float32 mean, then the mean square deviation, rstd by
// rsqrtf, one rounding).  src and dst may be the same (shared memory in place).
template <typename T>
__device__ __forceinline__ void layer_norm_row(DwConvArgs const& a, T const* src, T* const (&dst)[kMaxProjections],
                                               int lane) {
  float sum = 0.0f;
  for (int e = lane; e < a.c; e += 32) sum += to_float(src[e]);
  const float mean = warp_sum(sum) / static_cast<float>(a.c);
  float sq = 0.0f;
  for (int e = lane; e < a.c; e += 32) {
    const float d = to_float(src[e]) - mean;
    sq += d * d;
  }
  const float rstd = rsqrtf(warp_sum(sq) / static_cast<float>(a.c) + a.ln_eps);
  for (int e = lane; e < a.c; e += 32) {
    const float gamma = a.ln_weight ? load_param<T>(a.ln_weight, e, a.ln_params_f32) : 1.0f;
    const float beta = a.ln_bias ? load_param<T>(a.ln_bias, e, a.ln_params_f32) : 0.0f;
    const T v = from_float<T>((to_float(src[e]) - mean) * rstd * gamma + beta);
#pragma unroll
    for (int j = 0; j < kMaxProjections; ++j)
      if (dst[j]) dst[j][e] = v;
  }
}

// LayerNorm of the band's in-map pixels in shared memory, in place (a.layer_norm; the slice holds
// all `chunks` of a pixel), with layer_norm_rows's arithmetic (float32 mean, then the mean square
// deviation, rsqrtf, one rounding): a thread per pixel takes its statistics (two passes over its
// chunks, each lane starting at its own chunk so that a warp's 16-byte reads spread over the
// banks), then a thread per (pixel, chunk) normalizes.  No shuffles: every step is parallel.
template <typename T>
__device__ __forceinline__ void layer_norm_band(DwConvArgs const& a, uint4* tile, int pixels, int cols, int r0,
                                                int chunks) {
  float2* stats = reinterpret_cast<float2*>(tile + pixels * chunks);
  float* gamma = reinterpret_cast<float*>(stats + pixels);
  float* beta = gamma + a.c;
  for (int e = threadIdx.x; e < a.c; e += kTileThreads) {
    gamma[e] = a.ln_weight ? load_param<T>(a.ln_weight, e, a.ln_params_f32) : 1.0f;
    beta[e] = a.ln_bias ? load_param<T>(a.ln_bias, e, a.ln_params_f32) : 0.0f;
  }
  for (int pixel = threadIdx.x; pixel < pixels; pixel += kTileThreads) {
    uint4 const* v = tile + pixel * chunks;
    float sum = 0.0f;
    for (int k = 0, g = threadIdx.x % chunks; k < chunks; ++k, g = g + 1 == chunks ? 0 : g + 1) {
      const uint4 raw = v[g];
      T const* e = reinterpret_cast<T const*>(&raw);
#pragma unroll
      for (int i = 0; i < 8; ++i) sum += to_float(e[i]);
    }
    const float mean = sum / static_cast<float>(a.c);
    float sq = 0.0f;
    for (int k = 0, g = threadIdx.x % chunks; k < chunks; ++k, g = g + 1 == chunks ? 0 : g + 1) {
      const uint4 raw = v[g];
      T const* e = reinterpret_cast<T const*>(&raw);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float d = to_float(e[i]) - mean;
        sq += d * d;
      }
    }
    stats[pixel] = make_float2(mean, rsqrtf(sq / static_cast<float>(a.c) + a.ln_eps));
  }
  __syncthreads();
  for (int i = threadIdx.x; i < pixels * chunks; i += kTileThreads) {
    const int pixel = i / chunks, g = i % chunks;
    const int y = r0 - 1 + pixel / cols, x = pixel % cols - 1;
    if (y < 0 || y >= a.h || x < 0 || x >= a.w) continue;  // padding stays zero
    const float2 st = stats[pixel];
    uint4 raw = tile[i];
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int k = 0; k < 8; ++k)
      e[k] = from_float<T>((to_float(e[k]) - st.x) * st.y * gamma[g * 8 + k] + beta[g * 8 + k]);
    tile[i] = raw;
  }
}

// The CTA's body (the kernel below; the CPU emulator calls it with its own shared memory).
template <typename T>
__device__ __forceinline__ void dw_tile_body(DwConvArgs const& a, TileShape const& s, uint4* tile) {
  const int chunks_total = a.c / 8;
  long long cta = blockIdx.x;
  const int slice = static_cast<int>(cta % s.slices);
  cta /= s.slices;
  const int band = static_cast<int>(cta % s.bands);
  const long long img = cta / s.bands;
  const int r0 = band * s.rows;
  const int g0 = slice * s.chunks;
  const int gs = chunks_total - g0 < s.chunks ? chunks_total - g0 : s.chunks;  // this slice's chunks
  const int cols = a.w + 2;
  T const* image = static_cast<T const*>(a.x) + img * a.x_image_stride;

  // 1. the band and its halo: shared row i, column k <- input row r0 - 1 + i, column k - 1
  const int copies = (s.rows + 2) * cols * gs;
  for (int i = threadIdx.x; i < copies; i += kTileThreads) {
    const int g = i % gs, pixel = i / gs;
    const int y = r0 - 1 + pixel / cols, x = pixel % cols - 1;
    const bool inside = y >= 0 && y < a.h && x >= 0 && x < a.w;
    T const* src = inside ? image + (static_cast<long long>(y) * a.w + x) * a.c + (g0 + g) * 8 : image;
    copy16_or_zero(tile + pixel * s.chunks + g, src, inside);
  }
  // each output's lead rows (CvT's cls token), by the first band's CTAs, meanwhile
  if (band == 0 && !a.layer_norm) {
    for (int i = threadIdx.x; i < a.projections * a.lead * gs; i += kTileThreads) {
      const int g = i % gs, r = (i / gs) % a.lead, j = i / (gs * a.lead);
      const long long out_rows = a.lead + static_cast<long long>(a.ho[j]) * a.wo[j];
      HalfChunk<T, 8> v;
      v.load(static_cast<T const*>(a.lead_tokens) + img * a.lead_image_stride + static_cast<long long>(r) * a.c +
             (g0 + g) * 8);
      v.store(static_cast<T*>(a.y[j]) + (img * out_rows + r) * a.c + (g0 + g) * 8);
    }
  }
  copies_wait();
  __syncthreads();
  if (a.layer_norm) {  // the band's pixels in place (halo zeros stay: padding), the lead rows
    layer_norm_band<T>(a, tile, (s.rows + 2) * cols, cols, r0, gs);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int r = warp; band == 0 && r < a.lead; r += kTileThreads / 32) {
      T* outs[kMaxProjections] = {nullptr, nullptr, nullptr};
      for (int j = 0; j < a.projections; ++j)
        outs[j] = static_cast<T*>(a.y[j]) + (img * (a.lead + static_cast<long long>(a.ho[j]) * a.wo[j]) + r) * a.c;
      layer_norm_row<T>(a, static_cast<T const*>(a.lead_tokens) + img * a.lead_image_stride +
                               static_cast<long long>(r) * a.c, outs, lane);
    }
    __syncthreads();
  }

  // 2. work items: (projection, output row in the band, strip of kTileStrip outputs), the
  // thread's chunk fixed; positions (threads sharing a chunk) take items in turn
  const int g = threadIdx.x % s.chunks, position = threadIdx.x / s.chunks;
  const int positions = kTileThreads / s.chunks;
  if (g >= gs || position >= positions) return;  // (no barrier below)
  int first_row[kMaxProjections], band_rows[kMaxProjections], strips[kMaxProjections];
  int items = 0;
  for (int j = 0; j < a.projections; ++j) {
    const int st = a.stride[j];
    first_row[j] = r0 / st;  // r0 even: a stride-2 output row's centre 2 oy lies in the band
    const int end_row = (r0 + s.rows) / st < a.ho[j] ? (r0 + s.rows) / st : a.ho[j];
    band_rows[j] = end_row - first_row[j];
    strips[j] = (a.wo[j] + kTileStrip - 1) / kTileStrip;
    items += band_rows[j] * strips[j];
  }
  float w[72], bias[8];
  int taps_of = -1;
  for (int item = position; item < items; item += positions) {
    int j = 0, k = item;
    while (k >= band_rows[j] * strips[j]) k -= band_rows[j] * strips[j++];
    if (j != taps_of) {  // items go projection by projection: each thread loads a few tap sets
      const long long first = (static_cast<long long>(j) * a.c + (g0 + g) * 8) * 9;
      load_taps<T>(a, first, w);
#pragma unroll
      for (int e = 0; e < 8; ++e)
        bias[e] = a.bias ? load_param<T>(a.bias, static_cast<long long>(j) * a.c + (g0 + g) * 8 + e, a.params_f32)
                         : 0.0f;
      taps_of = j;
    }
    const int st = a.stride[j];
    const int oy = first_row[j] + k / strips[j];
    const int ox0 = (k % strips[j]) * kTileStrip;
    const int count = a.wo[j] - ox0 < kTileStrip ? a.wo[j] - ox0 : kTileStrip;
    // the window's top row: input row st * oy - 1, shared row st * oy - r0
    uint4 const* const row[3] = {tile + ((st * oy - r0) * cols) * s.chunks + g,
                                 tile + ((st * oy - r0 + 1) * cols) * s.chunks + g,
                                 tile + ((st * oy - r0 + 2) * cols) * s.chunks + g};
    const long long out_rows = a.lead + static_cast<long long>(a.ho[j]) * a.wo[j];
    T* out = static_cast<T*>(a.y[j]) + (img * out_rows + a.lead + static_cast<long long>(oy) * a.wo[j] + ox0) * a.c +
             (g0 + g) * 8;
    float col[3][8], acc0[8], acc1[8];
    // output ox reads shared columns st * ox .. st * ox + 2
    if (st == 1) {
      float acc2[8];
      load_window_column<T>(row, ox0, s.chunks, col);
      add_column<true>(acc0, col, w, bias, 0);
      load_window_column<T>(row, ox0 + 1, s.chunks, col);
      add_column<false>(acc0, col, w, bias, 1);
      add_column<true>(acc1, col, w, bias, 0);
#pragma unroll 1
      for (int t = 0; t < count; ++t) {  // column ox0 + t + 2: the last of output t's window
        load_window_column<T>(row, ox0 + t + 2, s.chunks, col);
        add_column<false>(acc0, col, w, bias, 2);
        store_floats<8>(out + static_cast<long long>(t) * a.c, acc0);
        add_column<false>(acc1, col, w, bias, 1);
        add_column<true>(acc2, col, w, bias, 0);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          acc0[e] = acc1[e];
          acc1[e] = acc2[e];
        }
      }
    } else {
      load_window_column<T>(row, 2 * ox0, s.chunks, col);
      add_column<true>(acc0, col, w, bias, 0);
#pragma unroll 1
      for (int t = 0; t < count; ++t) {
        const int c0 = 2 * (ox0 + t);
        load_window_column<T>(row, c0 + 1, s.chunks, col);
        add_column<false>(acc0, col, w, bias, 1);
        load_window_column<T>(row, c0 + 2, s.chunks, col);  // also the next output's first column
        add_column<false>(acc0, col, w, bias, 2);
        store_floats<8>(out + static_cast<long long>(t) * a.c, acc0);
        add_column<true>(acc0, col, w, bias, 0);
      }
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kTileThreads, 3) dw_conv_tile_kernel(DwConvArgs a, TileShape s) {
  extern __shared__ uint4 dw_tile[];
  dw_tile_body<T>(a, s, dw_tile);
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
// autograd added the three (190 / 133 / 75 us per attention, H100, CvT-13 at N=64, timed by a
// probe of the input gradient alone).
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

// The kernel variant to run, for the launcher (dw_conv3x3_tokens_kernel.cu) and the CPU emulator alike:
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

// The forward launch the CUDA launcher makes and the CPU emulator mirrors: the tiled kernel
// where 16-byte vectors work and its band fits shared memory (unless `tiled` is off), else the
// strip kernel (vec 8 or 1).  grid: CTAs; smem_bytes: the tiled kernel's dynamic shared memory.
struct DwConvPlan {
  int vec;
  bool tiled;
  TileShape shape;
  long long grid;
  long long smem_bytes;
};

inline DwConvPlan dw_conv_plan(DwConvArgs const& a, int num_sms, bool tiled, long long max_bytes = kTileMaxBytes) {
  DwConvPlan p{dw_conv_vec(a), false, TileShape{0, 0, 0, 0}, 0, 0};
  if (tiled && p.vec == 8) {
    p.shape = dw_tile_shape(a, 2LL * num_sms, max_bytes);
    if (p.shape.rows > 0) {
      p.tiled = true;
      p.grid = a.n * p.shape.bands * p.shape.slices;
      p.smem_bytes = tile_bytes(p.shape.rows, a.w, p.shape.chunks) + layer_norm_bytes(a, p.shape.rows);
      return p;
    }
  }
  p.grid = dw_conv_ctas(a, p.vec, 32LL * num_sms);
  return p;
}

}  // namespace dw_conv
}  // namespace cutlass_ops
