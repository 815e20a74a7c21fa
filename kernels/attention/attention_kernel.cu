// Attention for few keys (attention_kernel.h): one CTA per (64 queries, head, image), the head's
// keys and values whole in shared memory, WMMA tensor-core tiles, float32 scores and softmax.
//
// The CTA loads its 64 query rows and the head's Lkv key and value rows with cp.async (all in
// flight at once), then each of the 4 warps takes 16 queries through the key tiles twice:
//   pass 1: S = Q K^T tile by tile (16 keys), each row's running maximum;
//   pass 2: S again, P = exp(scale (S - max)) rounded to the input dtype (as flash attention
//           does), the row sums in float32, O += P V.
// Recomputing S costs 16 x Lkv x 64 MACs a warp, little next to keeping a 16 x Lkv float32 score
// block per warp in shared memory (13 KB at Lkv 208), which left room for one CTA an SM.  The
// accumulator tiles go through shared memory to reach the lanes (WMMA's fragment layout is
// opaque): lane i owns row i / 2, columns (i % 2) * 8 .. + 8 of each score tile.
#include "attention/attention_kernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <cstdint>

#include "common/dynamic_smem.h"
#include "common/programmatic_launch.cuh"

namespace cutlass_ops {
namespace attention {

namespace {

using namespace nvcuda;

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kQueriesPerCta = 16 * kWarps;
constexpr int kLd = kHeadDim + 8;    // Q, K, V rows in shared memory (elements): 16-byte rows 16 bytes apart in bank
constexpr int kScoreLd = 16 + 4;     // a warp's 16 x 16 float32 score tile
constexpr int kProbLd = 16 + 8;      // its 16 x 16 probabilities in the input dtype
constexpr int kOutLd = kHeadDim + 4; // the 16 x 64 float32 output, after the key loop
constexpr size_t kScoreBytes = sizeof(float) * 16 * kScoreLd;
constexpr size_t kWarpBytes = (sizeof(float) * 16 * kOutLd + 127) / 128 * 128;  // >= scores + probabilities
static_assert(kScoreBytes + 2 * 16 * kProbLd <= kWarpBytes, "the output staging aliases the score tiles");

size_t smem_bytes(int padded_keys) {
  return 2 * (size_t(kQueriesPerCta) + 2 * size_t(padded_keys)) * kLd + kWarps * kWarpBytes;
}

template <typename T> __device__ T from_float(float v);
template <> __device__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// 16 bytes global -> shared, zeros where !valid (cp.async's source size 0).
__device__ __forceinline__ void cp_async16(void* dst, void const* src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  unsigned const d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 16 : 0));
#endif
}

// Rows 0 .. rows - 1 of a head's (L, 64) slice into shared memory [rows][kLd], zeros past `valid`.
template <typename T>
__device__ __forceinline__ void load_rows(T* dst, T const* src, long long row_stride, int rows, int valid) {
  for (int i = threadIdx.x; i < rows * (kHeadDim / 8); i += kThreads) {
    int const row = i / (kHeadDim / 8), chunk = i % (kHeadDim / 8);
    bool const ok = row < valid;
    cp_async16(dst + row * kLd + chunk * 8, src + (ok ? row * row_stride + chunk * 8 : 0), ok);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) attention_kernel(AttentionArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // cp.async and bf16 WMMA need sm80; the op never launches it on older GPUs
#else
  wait_for_previous_grid();
  extern __shared__ __align__(128) unsigned char smem[];
  int const q0 = blockIdx.x * kQueriesPerCta, h = blockIdx.y, n = blockIdx.z;
  int const key_tiles = (a.lkv + 15) / 16, padded = 16 * key_tiles;
  T* Q = reinterpret_cast<T*>(smem);
  T* K = Q + kQueriesPerCta * kLd;
  T* V = K + padded * kLd;
  int const warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned char* region = reinterpret_cast<unsigned char*>(V + padded * kLd) + warp * kWarpBytes;
  float* score = reinterpret_cast<float*>(region);             // [16][kScoreLd]
  T* prob = reinterpret_cast<T*>(region + kScoreBytes);         // [16][kProbLd]
  float* out_stage = reinterpret_cast<float*>(region);          // [16][kOutLd], after the key loop

  T const* q = static_cast<T const*>(a.q) + n * a.q_image_stride + q0 * a.q_row_stride + h * kHeadDim;
  load_rows(Q, q, a.q_row_stride, kQueriesPerCta, a.lq - q0);
  load_rows(K, static_cast<T const*>(a.k) + n * a.k_image_stride + h * kHeadDim, a.k_row_stride, padded, a.lkv);
  load_rows(V, static_cast<T const*>(a.v) + n * a.v_image_stride + h * kHeadDim, a.v_row_stride, padded, a.lkv);
  asm volatile("cp.async.commit_group;\n" ::);
  asm volatile("cp.async.wait_group 0;\n" ::);
  __syncthreads();

  wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> qf[kHeadDim / 16];
#pragma unroll
  for (int d = 0; d < kHeadDim / 16; ++d) wmma::load_matrix_sync(qf[d], Q + warp * 16 * kLd + d * 16, kLd);
  int const row = lane / 2, col0 = (lane % 2) * 8;  // this lane's part of each 16 x 16 tile

  // S for key tile kt into `score` (row-major), visible to the whole warp on return.
  auto score_tile = [&](int kt) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> s;
    wmma::fill_fragment(s, 0.f);
#pragma unroll
    for (int d = 0; d < kHeadDim / 16; ++d) {
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> kf;  // K^T: column j = key j
      wmma::load_matrix_sync(kf, K + kt * 16 * kLd + d * 16, kLd);
      wmma::mma_sync(s, qf[d], kf, s);
    }
    __syncwarp();  // the previous tile's readers are done
    wmma::store_matrix_sync(score, s, kScoreLd, wmma::mem_row_major);
    __syncwarp();
  };

  float row_max = -INFINITY;
  for (int kt = 0; kt < key_tiles; ++kt) {
    score_tile(kt);
#pragma unroll
    for (int e = 0; e < 8; ++e)
      if (kt * 16 + col0 + e < a.lkv) row_max = fmaxf(row_max, score[row * kScoreLd + col0 + e]);
  }
  row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 1));

  float const scale_log2 = a.scale * 1.4426950408889634f;  // exp(x) = exp2(x log2 e)
  float row_sum = 0.f;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> of[kHeadDim / 16];
#pragma unroll
  for (int d = 0; d < kHeadDim / 16; ++d) wmma::fill_fragment(of[d], 0.f);
  for (int kt = 0; kt < key_tiles; ++kt) {
    score_tile(kt);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      bool const key = kt * 16 + col0 + e < a.lkv;
      float const p = key ? exp2f((score[row * kScoreLd + col0 + e] - row_max) * scale_log2) : 0.f;
      row_sum += p;
      prob[row * kProbLd + col0 + e] = from_float<T>(p);
    }
    __syncwarp();
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> pf;
    wmma::load_matrix_sync(pf, prob, kProbLd);
#pragma unroll
    for (int d = 0; d < kHeadDim / 16; ++d) {
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> vf;
      wmma::load_matrix_sync(vf, V + kt * 16 * kLd + d * 16, kLd);
      wmma::mma_sync(of[d], pf, vf, of[d]);
    }
  }
  row_sum += __shfl_xor_sync(0xffffffffu, row_sum, 1);

  __syncwarp();  // the last tile's probabilities are read: the output staging may overwrite them
#pragma unroll
  for (int d = 0; d < kHeadDim / 16; ++d)
    wmma::store_matrix_sync(out_stage + d * 16, of[d], kOutLd, wmma::mem_row_major);
  __syncwarp();
  // Lane i writes row i / 2's half (i % 2): 32 outputs, four 16-byte stores.
  int const query = q0 + warp * 16 + row;
  if (query < a.lq) {
    float const inv = 1.f / row_sum;
    float const* src = out_stage + row * kOutLd + (lane % 2) * 32;
    T* dst = static_cast<T*>(a.o) + ((static_cast<long long>(n) * a.lq + query) * a.heads + h) * kHeadDim +
             (lane % 2) * 32;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      alignas(16) T packed[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) packed[e] = from_float<T>(src[c * 8 + e] * inv);
      *reinterpret_cast<uint4*>(dst + c * 8) = *reinterpret_cast<uint4 const*>(packed);
    }
  }
#endif
}

template <typename T>
cudaError_t launch_typed(AttentionArgs const& a, cudaStream_t stream) {
  size_t const bytes = smem_bytes((a.lkv + 15) / 16 * 16);
  if (cudaError_t err = allow_dynamic_smem(attention_kernel<T>, bytes); err != cudaSuccess) return err;
  dim3 const grid((a.lq + kQueriesPerCta - 1) / kQueriesPerCta, a.heads, a.n);
  return launch_kernel<attention_kernel<T>>(grid, kThreads, bytes, stream, a.programmatic_launch, a);
}

}  // namespace

bool kernel_supports(int cc, int lkv) { return cc >= 80 && lkv >= 1 && lkv <= kMaxKeys; }

cudaError_t launch_attention(AttentionArgs const& a, cudaStream_t stream) {
  return a.dtype == DType::kF16 ? launch_typed<__half>(a, stream) : launch_typed<__nv_bfloat16>(a, stream);
}

}  // namespace attention
}  // namespace cutlass_ops
