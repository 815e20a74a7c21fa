#include "space_to_depth_conv/space_to_depth_conv_backward_kernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <type_traits>

#include "common/dynamic_smem.h"
#include "common/grid_size.h"
#include "common/grid_sum.cuh"
#include "common/half_chunk.cuh"
#include "space_to_depth_conv/space_to_depth_patches.cuh"

namespace cutlass_ops {
namespace space_to_depth_conv {

namespace {

using namespace nvcuda;

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kPixels = 128;  // output pixels per tile
constexpr int kPad = 8;       // smem row padding (elements): fewer bank conflicts, rows 16-byte aligned

struct Smem {
  int lda, ldg, ldw;
  size_t a_bytes, g_bytes, w_bytes;
  size_t total() const { return a_bytes + g_bytes > w_bytes ? a_bytes + g_bytes : w_bytes; }
};

template <typename T>
Smem smem_layout(int C, int K) {
  Smem s;
  s.lda = 16 * C + kPad;  // patches [kPixels][16C]
  s.ldg = K + kPad;       // masked gradient [kPixels][K]
  s.ldw = 16 * C + 4;     // the CTA's dW [K][16C] in float, over both once the tiles are done
  s.a_bytes = sizeof(T) * kPixels * s.lda;
  s.g_bytes = sizeof(T) * kPixels * s.ldg;
  s.w_bytes = sizeof(float) * K * s.ldw;
  return s;
}

// K = 16 * kTilesK.  The K/16 x C accumulator tiles of dW are dealt round-robin to the warps,
// at most kMaxTiles each (C <= 16).
template <typename T, int kTilesK>
__global__ void __launch_bounds__(kThreads) weight_grad_kernel(WeightGradArgs a, Smem s) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  // bf16 WMMA needs sm80; the op never launches it on older GPUs (kernel_supports).
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    __trap();
  } else
#endif
  {
    constexpr int K = 16 * kTilesK;
    constexpr int kMaxTiles = (kTilesK * 16 + kWarps - 1) / kWarps;
    extern __shared__ __align__(128) unsigned char smem[];
    T* A = reinterpret_cast<T*>(smem);                  // [kPixels][lda]
    T* Gz = reinterpret_cast<T*>(smem + s.a_bytes);     // [kPixels][ldg]
    float* dw_tile = reinterpret_cast<float*>(smem);    // [K][ldw], after the last tile
    int const KC = 16 * a.C, col_tiles = a.C;           // 16C columns: C tiles of 16
    int const tiles = kTilesK * col_tiles;
    int const M = a.N * (a.H / kBlock) * (a.W / kBlock);
    int const warp = threadIdx.x / 32;
    bool const has_post_bias = a.post_bias != nullptr;
    float const inactive = has_post_bias ? to_float(from_float<T>(*a.post_bias)) : 0.0f;
    T const* grad = static_cast<T const*>(a.grad);
    T const* out = static_cast<T const*>(a.out);

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kMaxTiles];
#pragma unroll
    for (int t = 0; t < kMaxTiles; ++t) wmma::fill_fragment(acc[t], 0.0f);
    float sums[2] = {0.0f, 0.0f};  // sum(grad), sum(grad_z)

    for (int m0 = blockIdx.x * kPixels; m0 < M; m0 += gridDim.x * kPixels) {
      load_patches<T, kThreads>(static_cast<T const*>(a.input), a.N, a.C, a.H, a.W, a.stride_n, a.stride_c,
                                a.stride_h, a.stride_w, m0, kPixels, A, s.lda);
      // The tile's gradient rows (K contiguous channels a pixel), masked, 16 bytes a load.
      for (int i = threadIdx.x; i < kPixels * (K / 8); i += kThreads) {
        int const pix = i / (K / 8), k0 = (i % (K / 8)) * 8, m = m0 + pix;
        HalfChunk<T, 8> g;
        if (m < M) {
          g.load(grad + size_t(m) * K + k0);
          HalfChunk<T, 8> o;
          if (out != nullptr) o.load(out + size_t(m) * K + k0);
#pragma unroll
          for (int k = 0; k < 8; ++k) {
            float const gk = to_float(g.v[k]);
            sums[0] += gk;
            float const ok = out != nullptr ? to_float(o.v[k]) : 1.0f;
            bool const active = out == nullptr || (has_post_bias ? !(ok == inactive) : ok > 0.0f);
            if (active) {
              sums[1] += gk;
            } else {
              g.v[k] = from_float<T>(0.0f);
            }
          }
        } else {
#pragma unroll
          for (int k = 0; k < 8; ++k) g.v[k] = from_float<T>(0.0f);
        }
        g.store(Gz + pix * s.ldg + k0);
      }
      __syncthreads();
      // dW tile (kt, ct) += Gz^T[kt rows] * A[ct columns] over the tile's pixels.
#pragma unroll
      for (int t = 0; t < kMaxTiles; ++t) {
        int const tile = warp + t * kWarps;
        if (tile < tiles) {
          int const kt = tile / col_tiles, ct = tile % col_tiles;
          for (int p = 0; p < kPixels; p += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::col_major> fa;  // Gz^T: (k, pix) at pix*ldg + k
            wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fb;
            wmma::load_matrix_sync(fa, Gz + p * s.ldg + kt * 16, s.ldg);
            wmma::load_matrix_sync(fb, A + p * s.lda + ct * 16, s.lda);
            wmma::mma_sync(acc[t], fa, fb, acc[t]);
          }
        }
      }
      __syncthreads();  // A and Gz are free for the next tile
    }

    // The CTA's dW and sums to its row of partials.
#pragma unroll
    for (int t = 0; t < kMaxTiles; ++t) {
      int const tile = warp + t * kWarps;
      if (tile < tiles) {
        int const kt = tile / col_tiles, ct = tile % col_tiles;
        wmma::store_matrix_sync(dw_tile + kt * 16 * s.ldw + ct * 16, acc[t], s.ldw, wmma::mem_row_major);
      }
    }
    block_sum<kThreads>(sums);  // also a barrier: dw_tile is complete
    float* row = a.partials + size_t(blockIdx.x) * (K * KC + 2);
    for (int i = threadIdx.x; i < K * KC; i += kThreads) row[i] = dw_tile[(i / KC) * s.ldw + i % KC];
    if (threadIdx.x == 0) {
      row[K * KC] = sums[0];
      row[K * KC + 1] = sums[1];
    }
  }
}

// Every row's entries summed over the rows, in a fixed order: 32 consecutive entries per
// CTA, warp w over rows w, w + 8, ... (coalesced), then the eight warps' sums in order.
__global__ void __launch_bounds__(kThreads) weight_grad_final_kernel(WeightGradArgs a, int rows) {
  __shared__ float warp_totals[kWarps][32];
  int const entries = a.K * 16 * a.C + 2;
  int const warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int const e = blockIdx.x * 32 + lane;
  float total = 0.0f;
  if (e < entries) {
#pragma unroll 8
    for (int r = warp; r < rows; r += kWarps) total += a.partials[size_t(r) * entries + e];
  }
  warp_totals[warp][lane] = total;
  __syncthreads();
  if (warp != 0 || e >= entries) return;
  total = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) total += warp_totals[w][lane];
  if (e < entries - 2) {
    a.grad_weight[e] = total;
  } else {
    a.sums[e - (entries - 2)] = total;
  }
}

template <typename T, int kTilesK>
cudaError_t launch_typed(WeightGradArgs const& a, int blocks, cudaStream_t stream) {
  Smem s = smem_layout<T>(a.C, a.K);
  auto kernel = weight_grad_kernel<T, kTilesK>;
  if (cudaError_t err = allow_dynamic_smem(kernel, s.total()); err != cudaSuccess) return err;
  kernel<<<blocks, kThreads, s.total(), stream>>>(a, s);
  int const entries = a.K * 16 * a.C + 2;
  weight_grad_final_kernel<<<(entries + 31) / 32, kThreads, 0, stream>>>(a, blocks);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_for_k(WeightGradArgs const& a, int blocks, cudaStream_t stream) {
  switch (a.K) {
    case 32: return launch_typed<T, 2>(a, blocks, stream);
    case 64: return launch_typed<T, 4>(a, blocks, stream);
    case 128: return launch_typed<T, 8>(a, blocks, stream);
    default: return cudaErrorInvalidValue;  // kernel_supports() said no
  }
}

}  // namespace

int weight_grad_blocks(int N, int H, int W, int num_sms) {
  // Two CTAs per SM (each a row of partials: 12 KB for K=64, C=3), fewer for small inputs.
  long long const tiles = ((long long)N * (H / kBlock) * (W / kBlock) + kPixels - 1) / kPixels;
  return clamp_grid(tiles, 2LL * num_sms);
}

cudaError_t launch_space_to_depth_conv_weight_grad(WeightGradArgs const& a, int blocks, cudaStream_t stream) {
  return a.dtype == DType::kF16 ? launch_for_k<__half>(a, blocks, stream)
                                : launch_for_k<__nv_bfloat16>(a, blocks, stream);
}

}  // namespace space_to_depth_conv
}  // namespace cutlass_ops
