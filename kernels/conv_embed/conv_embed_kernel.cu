// Conv embedding: implicit GEMM over the patch matrix, with WMMA tensor-core tiles, then the bias
// and the LayerNorm over each pixel's K channels, which one lane holds whole.
//
// The patch matrix's columns are the window rows (c, r), each padded to kRowWidth = 8 columns
// (the weight is zero there): a lane stores one window row of its pixel as one 16-byte word.
// Each warp owns 32 output pixels at a time (consecutive in (n, p, q), so their tokens are one
// contiguous stretch of the output) and works alone after the CTA has loaded the weight:
//   1. gather: lane i loads pixel i's window, kRowsInFlight rows before storing any (latency:
//      neighbouring lanes read input columns `stride` apart, a few sectors a load), into row i
//      of A (row-major in shared memory);
//   2. MMA: A (32 x KP) times the weight (KP x K) in 16x16x16 fragments, float32 accumulators;
//   3. epilogue: the accumulators through shared memory (a row per pixel), lane i adds the bias
//      and normalizes pixel i's row in float32, rounds once, and the warp writes its 32 tokens
//      with 16-byte coalesced stores.
// The weight (K x KP) stays in shared memory for the CTA's life; CTAs are persistent (a grid of
// what fits at once), so it is read once per CTA, not once per tile.
// What the first forms measured (H100, N=64, fp16): one element loaded and stored at a time
// (column-major A), 137 us, latency-bound; 12 rows in flight, 79 us, issue-bound (~4,000
// instructions a tile: an index multiply and a 2-byte store per element, divisions per weight
// element in the prologue).
#include "conv_embed/conv_embed_kernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <cstdint>
#include <type_traits>

#include "common/dynamic_smem.h"
#include "common/half_chunk.cuh"
#include "common/programmatic_launch.cuh"

namespace cutlass_ops {
namespace conv_embed {

namespace {

using namespace nvcuda;

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kPixels = 32;   // output pixels per warp tile: two 16-row A fragments
constexpr int kMaxKp = 256;   // the patch row (GEMM K, window rows x kRowWidth) in shared memory
constexpr int kRowWidth = 8;  // patch columns per window row (c, r): the kernel width S <= 8
constexpr int kRowsInFlight = 12;  // window rows a lane loads before storing any

struct Layout {
  int kp;         // C*R*kRowWidth rounded up to 16
  int lda, ldb;   // A and weight row strides (elements): multiples of 8, as WMMA wants
  int ldacc;      // accumulator row stride (floats)
  int ldout;      // output staging row stride (elements)
  size_t b_bytes, param_bytes, warp_bytes;
  size_t total() const { return b_bytes + param_bytes + kWarps * warp_bytes; }
};

Layout make_layout(int window_rows, int K) {
  Layout s;
  s.kp = (window_rows * kRowWidth + 15) / 16 * 16;
  s.lda = s.ldb = s.kp + 8;  // 16-byte rows 16 bytes apart in bank: a quarter-warp's stores miss no bank twice
  s.ldacc = K + 4;  // the same for the float4 row reads
  s.ldout = K + 8;
  s.b_bytes = size_t(2) * K * s.ldb;
  s.param_bytes = size_t(4) * 3 * K;
  size_t const a_bytes = size_t(2) * kPixels * s.lda;
  size_t const acc_bytes = size_t(4) * kPixels * s.ldacc;  // the output staging aliases it (smaller)
  size_t const larger = a_bytes > acc_bytes ? a_bytes : acc_bytes;
  s.warp_bytes = (larger + 127) / 128 * 128;
  return s;
}

// v = *p where `pred`, else 0: a predicated load whose address is formed unconditionally (as an
// integer: it may point outside the image where pred is false).  Written as PTX because nvcc,
// given `pred ? p[t] : 0` per element, re-derived each load's address under its own predicate:
// ~10 instructions an element, which made the gather issue-bound.
__device__ __forceinline__ uint32_t load_u16_if(unsigned long long p, bool pred) {
  unsigned short v;
  asm("{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %2, 0;\n\tmov.b16 %0, 0;\n\t@q ld.global.nc.u16 %0, [%1];\n\t}"
      : "=h"(v) : "l"(p), "r"(int(pred)));
  return v;
}
__device__ __forceinline__ uint32_t load_u32_if(unsigned long long p, bool pred) {
  uint32_t v;
  asm("{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %2, 0;\n\tmov.b32 %0, 0;\n\t@q ld.global.nc.u32 %0, [%1];\n\t}"
      : "=r"(v) : "l"(p), "r"(int(pred)));
  return v;
}

// Row `lane` of A <- pixel m's window, row (c, r) at columns (c R + r) * 8 + t; zeros where the
// window leaves the image, at t >= S, past the last window row and past the last pixel.
// Loads: kPaired, two adjacent columns as one 4-byte word (a.paired_loads: adjacent columns,
// even strides and offsets, so a pair is wholly inside the image or wholly outside); otherwise
// one element at a time, `stride_w` apart.
template <bool kPaired>
__device__ inline void gather_patch(ConvEmbedArgs const& a, Layout const& s, int m, int M, uint16_t* A) {
  int const lane = threadIdx.x % 32;
  int const rows = a.C * a.R;
  uint4* dst = reinterpret_cast<uint4*>(A + lane * s.lda);  // one 16-byte word per window row
  bool const live = m < M;
  int ih0 = 0;
  uint32_t col_ok = 0;  // bit t: input column iw0 + t inside the image (t < S)
  long long base = 0;
  long long const sc = a.in_stride[1], sh = a.in_stride[2], sw = a.in_stride[3];
  if (live) {
    int const PQ = a.P * a.Q;
    int const n = m / PQ, pq = m % PQ, p = pq / a.Q, q = pq % a.Q;
    int const iw0 = q * a.stride_w - a.pad_w;
    ih0 = p * a.stride_h - a.pad_h;
    for (int t = 0; t < a.S; ++t) col_ok |= uint32_t(iw0 + t >= 0 && iw0 + t < a.W) << t;
    base = n * a.in_stride[0] + ih0 * sh + iw0 * sw;
  }
  // kPaired, odd S: the last pair's second column is past the window (the weight's zero there
  // would still turn an Inf or NaN of that pixel into NaN): masked off.
  uint32_t const last_pair_mask = a.S % 2 ? 0x0000ffffu : 0xffffffffu;
  unsigned long long const x = reinterpret_cast<unsigned long long>(a.input);
  int c = 0, r = 0;  // window row row0 + i, advanced without divisions
  for (int row0 = 0; row0 < rows; row0 += kRowsInFlight) {
    uint32_t v[kRowsInFlight][kRowWidth / 2];  // packed pairs, as the 16-byte store takes them
#pragma unroll
    for (int i = 0; i < kRowsInFlight; ++i) {
      bool const row_ok = row0 + i < rows && ih0 + r >= 0 && ih0 + r < a.H;
      uint32_t const ok = row_ok ? col_ok : 0u;  // 0 for a dead lane
      unsigned long long const src = x + 2ull * static_cast<unsigned long long>(base + c * sc + r * sh);
#pragma unroll
      for (int t2 = 0; t2 < kRowWidth / 2; ++t2) {
        int const t = 2 * t2;
        if (kPaired) {
          v[i][t2] = load_u32_if(src + 2 * t, (ok >> t) & 1u);
          if (2 * t2 + 2 >= a.S) v[i][t2] &= 2 * t2 + 1 == a.S ? last_pair_mask : 0xffffffffu;
        } else {
          v[i][t2] = load_u16_if(src + 2 * t * sw, (ok >> t) & 1u) |
                     load_u16_if(src + 2 * (t + 1) * sw, (ok >> (t + 1)) & 1u) << 16;
        }
      }
      if (++r == a.R) {
        r = 0;
        ++c;
      }
    }
#pragma unroll
    for (int i = 0; i < kRowsInFlight; ++i)
      if (row0 + i < rows) dst[row0 + i] = make_uint4(v[i][0], v[i][1], v[i][2], v[i][3]);
  }
  for (int g = rows; g < s.kp / kRowWidth; ++g) dst[g] = make_uint4(0, 0, 0, 0);
}

template <typename T, int kTilesN>
__device__ void conv_embed_body(ConvEmbedArgs const& a, Layout const& s) {
  constexpr int K = 16 * kTilesN;
  extern __shared__ __align__(128) unsigned char smem[];
  T* B = reinterpret_cast<T*>(smem);  // [K][ldb]: B column-major (weight row k = column k)
  float* bias = reinterpret_cast<float*>(smem + s.b_bytes);
  float* gamma = bias + K;
  float* beta = gamma + K;
  int const warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned char* region = smem + s.b_bytes + s.param_bytes + warp * s.warp_bytes;
  uint16_t* A = reinterpret_cast<uint16_t*>(region);  // [kPixels][lda], row i = pixel i's patch
  float* acc_tile = reinterpret_cast<float*>(region);  // [kPixels][ldacc], after the MMAs
  uint16_t* out_tile = reinterpret_cast<uint16_t*>(region);  // [kPixels][ldout], after the epilogue reads

  // The weight in the patch's column order: lane-owned columns, their offsets into a weight row
  // computed once; each warp then loads every kWarps-th row, 4 rows in flight.
  constexpr int kMaxColsPerLane = kMaxKp / 32;
  long long col_off[kMaxColsPerLane];  // -1: a padding column (zero)
#pragma unroll
  for (int j = 0; j < kMaxColsPerLane; ++j) {
    int const col = lane + 32 * j, g = col / kRowWidth, t = col % kRowWidth;
    int const c = g / a.R, r = g % a.R;
    col_off[j] = col < s.kp && g < a.C * a.R && t < a.S
                     ? c * a.w_stride[1] + r * a.w_stride[2] + t * a.w_stride[3] : -1;
  }
  uint16_t const* w = static_cast<uint16_t const*>(a.weight);
  uint16_t* Bu = reinterpret_cast<uint16_t*>(B);
#pragma unroll 4
  for (int k = warp; k < K; k += kWarps) {
    uint16_t v[kMaxColsPerLane];
#pragma unroll
    for (int j = 0; j < kMaxColsPerLane; ++j) v[j] = col_off[j] >= 0 ? w[k * a.w_stride[0] + col_off[j]] : 0;
#pragma unroll
    for (int j = 0; j < kMaxColsPerLane; ++j)
      if (lane + 32 * j < s.kp) Bu[k * s.ldb + lane + 32 * j] = v[j];
  }
  for (int k = threadIdx.x; k < K; k += kThreads) {
    bias[k] = a.bias ? a.bias[k] : 0.f;
    gamma[k] = a.ln_weight ? a.ln_weight[k] : 1.f;
    beta[k] = a.ln_bias ? a.ln_bias[k] : 0.f;
  }
  __syncthreads();

  int const M = a.N * a.P * a.Q;  // < 2^31: the op checks
  int const tiles = (M + kPixels - 1) / kPixels;
  for (int tile = blockIdx.x * kWarps + warp; tile < tiles; tile += gridDim.x * kWarps) {
    int const m0 = tile * kPixels;
    if (a.paired_loads)
      gather_patch<true>(a, s, m0 + lane, M, A);
    else
      gather_patch<false>(a, s, m0 + lane, M, A);
    __syncwarp();

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][kTilesN];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < kTilesN; ++j) wmma::fill_fragment(acc[i][j], 0.f);
    T const* At = reinterpret_cast<T const*>(A);
    for (int kk = 0; kk < s.kp; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa[2];
      wmma::load_matrix_sync(fa[0], At + kk, s.lda);
      wmma::load_matrix_sync(fa[1], At + 16 * s.lda + kk, s.lda);
#pragma unroll
      for (int j = 0; j < kTilesN; ++j) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;
        wmma::load_matrix_sync(fb, B + j * 16 * s.ldb + kk, s.ldb);
        wmma::mma_sync(acc[0][j], fa[0], fb, acc[0][j]);
        wmma::mma_sync(acc[1][j], fa[1], fb, acc[1][j]);
      }
    }
    __syncwarp();  // A is read: the accumulators may overwrite it
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < kTilesN; ++j)
        wmma::store_matrix_sync(acc_tile + i * 16 * s.ldacc + j * 16, acc[i][j], s.ldacc, wmma::mem_row_major);
    __syncwarp();

    // Lane i: pixel m0 + i's K values, + bias, LayerNorm in float32 (two passes, as ATen's).
    float v[K];
    float4 const* row = reinterpret_cast<float4 const*>(acc_tile + lane * s.ldacc);
#pragma unroll
    for (int k4 = 0; k4 < K / 4; ++k4) {
      float4 t = row[k4];
      v[4 * k4] = t.x + bias[4 * k4];
      v[4 * k4 + 1] = t.y + bias[4 * k4 + 1];
      v[4 * k4 + 2] = t.z + bias[4 * k4 + 2];
      v[4 * k4 + 3] = t.w + bias[4 * k4 + 3];
    }
    if (a.layer_norm) {
      float sum = 0.f;
#pragma unroll
      for (int k = 0; k < K; ++k) sum += v[k];
      float const mean = sum / K;
      float sq = 0.f;
#pragma unroll
      for (int k = 0; k < K; ++k) sq += (v[k] - mean) * (v[k] - mean);
      float const rstd = rsqrtf(sq / K + a.eps);
#pragma unroll
      for (int k = 0; k < K; ++k) v[k] = (v[k] - mean) * rstd * gamma[k] + beta[k];
    }
    __syncwarp();  // every lane has read its accumulator row: the staging may overwrite them
    T* staged = reinterpret_cast<T*>(out_tile + lane * s.ldout);
#pragma unroll
    for (int k8 = 0; k8 < K / 8; ++k8)
      store_floats<8>(staged + 8 * k8, *reinterpret_cast<float const(*)[8]>(v + 8 * k8));
    __syncwarp();
    // The tile's tokens are one contiguous stretch of the output: 16-byte chunks, lane-strided.
    int const rows = M - m0 < kPixels ? M - m0 : kPixels;
    uint4* out = reinterpret_cast<uint4*>(static_cast<uint16_t*>(a.output) + static_cast<long long>(m0) * K);
    for (int i = lane; i < rows * (K / 8); i += 32) {
      int const r = i / (K / 8), c8 = i % (K / 8);
      out[i] = *reinterpret_cast<uint4 const*>(out_tile + r * s.ldout + c8 * 8);
    }
    __syncwarp();  // the staging is read: the next tile's gather may overwrite it
  }
}

// Three CTAs an SM (twelve warps) where the shared memory allows it (K <= 64; K = 128 fits two and
// would spill its 128 accumulator values under three's register cap).
template <typename T, int kTilesN>
__global__ void __launch_bounds__(kThreads, kTilesN == 8 ? 2 : 3) conv_embed_kernel(ConvEmbedArgs a, Layout s) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  // bf16 WMMA needs sm80; the op never launches it on older GPUs (kernel_supports).
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    __trap();
  } else
#endif
  {
    wait_for_previous_grid();
    conv_embed_body<T, kTilesN>(a, s);
  }
}

template <typename T, int kTilesN>
cudaError_t launch_typed(ConvEmbedArgs const& a, int num_sms, cudaStream_t stream) {
  Layout s = make_layout(a.C * a.R, a.K);
  auto kernel = conv_embed_kernel<T, kTilesN>;
  if (cudaError_t err = allow_dynamic_smem(kernel, s.total()); err != cudaSuccess) return err;
  int per_sm = 0;
  if (cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, s.total());
      err != cudaSuccess)
    return err;
  long long const M = static_cast<long long>(a.N) * a.P * a.Q;
  long long const ctas_needed = (M + kPixels * kWarps - 1) / (kPixels * kWarps);
  long long const resident = static_cast<long long>(num_sms) * (per_sm > 0 ? per_sm : 1);
  unsigned const grid = static_cast<unsigned>(ctas_needed < resident ? ctas_needed : resident);
  return launch_kernel<conv_embed_kernel<T, kTilesN>>(grid, kThreads, s.total(), stream, a.programmatic_launch, a,
                                                      s);
}

template <typename T>
cudaError_t launch_for_k(ConvEmbedArgs const& a, int num_sms, cudaStream_t stream) {
  switch (a.K) {
    case 32: return launch_typed<T, 2>(a, num_sms, stream);
    case 64: return launch_typed<T, 4>(a, num_sms, stream);
    case 128: return launch_typed<T, 8>(a, num_sms, stream);
    default: return cudaErrorInvalidValue;  // kernel_supports() said no
  }
}

}  // namespace

bool kernel_supports(DType dtype, int cc, int C, int R, int S, int K) {
  return cc >= (dtype == DType::kBF16 ? 80 : 70) && C >= 1 && R >= 1 && S >= 1 && S <= kRowWidth &&
         C * R * kRowWidth <= kMaxKp && (K == 32 || K == 64 || K == 128);
}

cudaError_t launch_conv_embed(ConvEmbedArgs const& a, int num_sms, cudaStream_t stream) {
  return a.dtype == DType::kF16 ? launch_for_k<__half>(a, num_sms, stream)
                                : launch_for_k<__nv_bfloat16>(a, num_sms, stream);
}

}  // namespace conv_embed
}  // namespace cutlass_ops
