// Conv embedding: implicit GEMM over the patch matrix, with WMMA tensor-core tiles, then the bias
// and the LayerNorm over each pixel's K channels, which one lane holds whole.
//
// Each warp owns 32 output pixels at a time (consecutive in (n, p, q), so their tokens are one
// contiguous stretch of the output) and works alone after the CTA has loaded the weight:
//   1. gather: lane i loads pixel i's C*R*S patch values into column i of A (column-major in
//      shared memory, so a warp's stores are 64 contiguous bytes); neighbouring lanes read input
//      columns `stride` apart, a few sectors a load;
//   2. MMA: A (32 x KP) times the weight (KP x K) in 16x16x16 fragments, float32 accumulators;
//   3. epilogue: the accumulators through shared memory (a row per pixel), lane i adds the bias
//      and normalizes pixel i's row in float32, rounds once, and the warp writes its 32 tokens
//      with 16-byte coalesced stores.
// The weight (K x KP, zero-padded) stays in shared memory for the CTA's life; CTAs are persistent
// (a grid of what fits at once), so it is read once per CTA, not once per tile.
#include "conv_embed/conv_embed_kernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <cstdint>
#include <type_traits>

#include "common/dynamic_smem.h"
#include "common/programmatic_launch.cuh"

namespace cutlass_ops {
namespace conv_embed {

namespace {

using namespace nvcuda;

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kPixels = 32;   // output pixels per warp tile: two 16-row A fragments
constexpr int kMaxCrs = 256;  // the patch row (GEMM K) in shared memory
constexpr int kLdA = kPixels + 8;  // A column stride (elements): a multiple of 8, as WMMA wants

struct Layout {
  int kp;         // C*R*S rounded up to 16
  int ldb;        // weight row stride (elements)
  int ldacc;      // accumulator row stride (floats)
  int ldout;      // output staging row stride (elements)
  size_t b_bytes, param_bytes, warp_bytes;
  size_t total() const { return b_bytes + param_bytes + kWarps * warp_bytes; }
};

Layout make_layout(int crs, int K) {
  Layout s;
  s.kp = (crs + 15) / 16 * 16;
  s.ldb = s.kp + 8;
  s.ldacc = K + 4;  // float4 rows 16 bytes apart in bank: a quarter-warp's row reads miss no bank twice
  s.ldout = K + 8;
  s.b_bytes = size_t(2) * K * s.ldb;
  s.param_bytes = size_t(4) * 3 * K;
  size_t a_bytes = size_t(2) * s.kp * kLdA;
  size_t acc_bytes = size_t(4) * kPixels * s.ldacc;  // the output staging aliases it (smaller)
  size_t const larger = a_bytes > acc_bytes ? a_bytes : acc_bytes;
  s.warp_bytes = (larger + 127) / 128 * 128;
  return s;
}

template <typename T> struct Pack;
template <> struct Pack<__half> {
  static __device__ uint32_t two(float a, float b) {
    __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&h);
  }
};
template <> struct Pack<__nv_bfloat16> {
  static __device__ uint32_t two(float a, float b) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&h);
  }
};

// Column i of A (kLdA apart per patch element) <- pixel m's patch, zeros where the window leaves
// the image, past C*R*S and past the last pixel.
__device__ inline void gather_patch(ConvEmbedArgs const& a, Layout const& s, int m, int M,
                                    uint16_t const* __restrict__ x, uint16_t* A) {
  int const lane = threadIdx.x % 32;
  int const crs = a.C * a.R * a.S;
  uint16_t* col = A + lane;
  if (m < M) {
    int const PQ = a.P * a.Q;
    int const n = m / PQ, pq = m % PQ, p = pq / a.Q, q = pq % a.Q;
    int const ih0 = p * a.stride_h - a.pad_h, iw0 = q * a.stride_w - a.pad_w;
    uint32_t col_ok = 0;  // bit j: input column iw0 + j inside the image
    for (int j = 0; j < a.S; ++j) col_ok |= uint32_t(iw0 + j >= 0 && iw0 + j < a.W) << j;
    long long const sc = a.in_stride[1], sh = a.in_stride[2], sw = a.in_stride[3];
    long long const base = n * a.in_stride[0] + ih0 * sh + iw0 * sw;
    int kr = 0;
    for (int c = 0; c < a.C; ++c) {
      for (int r = 0; r < a.R; ++r) {
        bool const row_ok = ih0 + r >= 0 && ih0 + r < a.H;
        uint32_t const ok = row_ok ? col_ok : 0u;
        long long const row = base + c * sc + r * sh;
#pragma unroll 4
        for (int j = 0; j < a.S; ++j) {
          // the index is formed only where the element exists (the window's start may be < 0)
          uint16_t v = (ok >> j) & 1u ? __ldg(x + row + j * sw) : uint16_t(0);
          col[(kr + j) * kLdA] = v;
        }
        kr += a.S;
      }
    }
    for (; kr < s.kp; ++kr) col[kr * kLdA] = 0;
  } else {
    for (int kr = 0; kr < s.kp; ++kr) col[kr * kLdA] = 0;
  }
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
  uint16_t* A = reinterpret_cast<uint16_t*>(region);  // [kp][kLdA], column i = pixel i
  float* acc_tile = reinterpret_cast<float*>(region);  // [kPixels][ldacc], after the MMAs
  uint16_t* out_tile = reinterpret_cast<uint16_t*>(region);  // [kPixels][ldout], after the epilogue reads

  int const crs = a.C * a.R * a.S, rs = a.R * a.S;
  uint16_t const* w = static_cast<uint16_t const*>(a.weight);
  uint16_t* Bu = reinterpret_cast<uint16_t*>(B);
  for (int i = threadIdx.x; i < K * s.kp; i += kThreads) {
    int const k = i / s.kp, kr = i % s.kp;
    uint16_t v = 0;
    if (kr < crs) {
      int const c = kr / rs, r = (kr % rs) / a.S, t = kr % a.S;
      v = w[k * a.w_stride[0] + c * a.w_stride[1] + r * a.w_stride[2] + t * a.w_stride[3]];
    }
    Bu[k * s.ldb + kr] = v;
  }
  for (int k = threadIdx.x; k < K; k += kThreads) {
    bias[k] = a.bias ? a.bias[k] : 0.f;
    gamma[k] = a.ln_weight ? a.ln_weight[k] : 1.f;
    beta[k] = a.ln_bias ? a.ln_bias[k] : 0.f;
  }
  __syncthreads();

  int const M = a.N * a.P * a.Q;  // < 2^31: the op checks
  int const tiles = (M + kPixels - 1) / kPixels;
  uint16_t const* x = static_cast<uint16_t const*>(a.input);
  for (int tile = blockIdx.x * kWarps + warp; tile < tiles; tile += gridDim.x * kWarps) {
    int const m0 = tile * kPixels;
    gather_patch(a, s, m0 + lane, M, x, A);
    __syncwarp();

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][kTilesN];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < kTilesN; ++j) wmma::fill_fragment(acc[i][j], 0.f);
    T const* At = reinterpret_cast<T const*>(A);
    for (int kk = 0; kk < s.kp; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::col_major> fa[2];
      wmma::load_matrix_sync(fa[0], At + kk * kLdA, kLdA);
      wmma::load_matrix_sync(fa[1], At + kk * kLdA + 16, kLdA);
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
    uint4* staged = reinterpret_cast<uint4*>(out_tile + lane * s.ldout);
#pragma unroll
    for (int k8 = 0; k8 < K / 8; ++k8) {
      uint4 u;
      u.x = Pack<T>::two(v[8 * k8], v[8 * k8 + 1]);
      u.y = Pack<T>::two(v[8 * k8 + 2], v[8 * k8 + 3]);
      u.z = Pack<T>::two(v[8 * k8 + 4], v[8 * k8 + 5]);
      u.w = Pack<T>::two(v[8 * k8 + 6], v[8 * k8 + 7]);
      staged[k8] = u;
    }
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

template <typename T, int kTilesN>
__global__ void __launch_bounds__(kThreads) conv_embed_kernel(ConvEmbedArgs a, Layout s) {
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
  Layout s = make_layout(a.C * a.R * a.S, a.K);
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

bool kernel_supports(DType dtype, int cc, int crs, int K, int S) {
  return cc >= (dtype == DType::kBF16 ? 80 : 70) && crs >= 1 && crs <= kMaxCrs && S <= 32 &&
         (K == 32 || K == 64 || K == 128);
}

cudaError_t launch_conv_embed(ConvEmbedArgs const& a, int num_sms, cudaStream_t stream) {
  return a.dtype == DType::kF16 ? launch_for_k<__half>(a, num_sms, stream)
                                : launch_for_k<__nv_bfloat16>(a, num_sms, stream);
}

}  // namespace conv_embed
}  // namespace cutlass_ops
