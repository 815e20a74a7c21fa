#include "space_to_depth_conv/space_to_depth_conv_kernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <type_traits>

#include "common/dynamic_smem.h"
#include "common/programmatic_launch.cuh"
#include "space_to_depth_conv/space_to_depth_patches.cuh"

namespace cutlass_ops {
namespace space_to_depth_conv {

namespace {

using namespace nvcuda;

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kPixels = 16 * kWarps;  // output pixels per CTA: 16 rows of A per warp
constexpr int kMaxC = 16;             // GEMM K = 16 * C <= 256
constexpr int kPad = 8;               // smem row padding (elements): fewer bank conflicts

struct Smem {
  int lda, ldb, ldacc;
  size_t a_bytes, b_bytes, acc_bytes;
  size_t total() const { return (a_bytes > acc_bytes ? a_bytes : acc_bytes) + b_bytes; }
};

template <typename T>
Smem smem_layout(int C, int K) {
  Smem s;
  s.lda = s.ldb = 16 * C + kPad;
  s.ldacc = K + 4;
  s.a_bytes = sizeof(T) * kPixels * s.lda;
  s.b_bytes = sizeof(T) * K * s.ldb;
  s.acc_bytes = sizeof(float) * kPixels * s.ldacc;  // aliases A once the MMAs are done
  return s;
}

template <typename T> struct Convert;
template <> struct Convert<__half> {
  static __device__ __half2 pack(float a, float b) { return __floats2half2_rn(a, b); }
};
template <> struct Convert<__nv_bfloat16> {
  static __device__ __nv_bfloat162 pack(float a, float b) { return __floats2bfloat162_rn(a, b); }
};

// kTilesN = K / 16 accumulator fragments per warp (each warp: 16 pixels x K channels).
template <typename T, int kTilesN>
__device__ void conv_tile(SpaceToDepthConvArgs const& a, Smem const& s) {
  extern __shared__ __align__(128) unsigned char smem[];
  T* A = reinterpret_cast<T*>(smem);                                    // [kPixels][lda]
  float* acc_tile = reinterpret_cast<float*>(smem);                     // [kPixels][ldacc]
  T* B = reinterpret_cast<T*>(smem + (s.a_bytes > s.acc_bytes ? s.a_bytes : s.acc_bytes));  // [K][ldb]
  constexpr int K = 16 * kTilesN;
  int const C = a.C, KC = 16 * a.C;
  int const P = a.H / kBlock, Q = a.W / kBlock;
  int const M = a.N * P * Q;  // < 2^31: the op checks the sizes
  int const m0 = blockIdx.x * kPixels;
  int const tid = threadIdx.x;

  // Weights: (K, 16C) row-major is B column-major (B[kc][k] at k * ldb + kc); 16 bytes a
  // load (16C and ldb are multiples of 8).
  uint4 const* w = static_cast<uint4 const*>(a.weight);
  for (int i = tid; i < K * KC / 8; i += kThreads) {
    int k = (i * 8) / KC, kc = (i * 8) % KC;
    *reinterpret_cast<uint4*>(B + k * s.ldb + kc) = w[i];
  }

  load_patches<T, kThreads>(static_cast<T const*>(a.input), a.N, C, a.H, a.W, a.stride_n, a.stride_c, a.stride_h,
                            a.stride_w, m0, kPixels, A, s.lda);
  __syncthreads();

  int const warp = tid / 32;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kTilesN];
#pragma unroll
  for (int j = 0; j < kTilesN; ++j) wmma::fill_fragment(acc[j], 0.f);
  for (int kk = 0; kk < KC; kk += 16) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
    wmma::load_matrix_sync(fa, A + warp * 16 * s.lda + kk, s.lda);
#pragma unroll
    for (int j = 0; j < kTilesN; ++j) {
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;
      wmma::load_matrix_sync(fb, B + j * 16 * s.ldb + kk, s.ldb);
      wmma::mma_sync(acc[j], fa, fb, acc[j]);
    }
  }
  __syncthreads();  // every warp is done with A: the accumulators may overwrite it
#pragma unroll
  for (int j = 0; j < kTilesN; ++j)
    wmma::store_matrix_sync(acc_tile + warp * 16 * s.ldacc + j * 16, acc[j], s.ldacc, wmma::mem_row_major);
  __syncthreads();

  // Epilogue: act + post_bias, 8 channels (16 bytes) per store; the CTA's output pixels
  // are contiguous in NHWC memory.
  float const post = a.post_bias ? *a.post_bias : 0.f;
  T* out = static_cast<T*>(a.output);
  for (int i = tid; i < kPixels * (K / 8); i += kThreads) {
    int pix = i / (K / 8), k0 = (i % (K / 8)) * 8;
    int const m = m0 + pix;
    if (m >= M) continue;
    float const* src = acc_tile + pix * s.ldacc + k0;
    uint4 raw;
    auto* pairs = reinterpret_cast<decltype(Convert<T>::pack(0.f, 0.f))*>(&raw);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float v0 = src[2 * j], v1 = src[2 * j + 1];
      if (a.relu) {  // keeps NaN, like torch.relu
        v0 = v0 < 0.f ? 0.f : v0;
        v1 = v1 < 0.f ? 0.f : v1;
      }
      pairs[j] = Convert<T>::pack(v0 + post, v1 + post);
    }
    *reinterpret_cast<uint4*>(out + static_cast<size_t>(m) * K + k0) = raw;
  }
}

template <typename T, int kTilesN>
__global__ void __launch_bounds__(kThreads) space_to_depth_conv_kernel(SpaceToDepthConvArgs a, Smem s) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  // bf16 WMMA needs sm80; the op never launches it on older GPUs (kernel_supports).
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    __trap();
  } else
#endif
  {
    wait_for_previous_grid();
    conv_tile<T, kTilesN>(a, s);
  }
}

template <typename T, int kTilesN>
cudaError_t launch_typed(SpaceToDepthConvArgs const& a, cudaStream_t stream) {
  Smem s = smem_layout<T>(a.C, a.K);
  auto kernel = space_to_depth_conv_kernel<T, kTilesN>;
  if (cudaError_t err = allow_dynamic_smem(kernel, s.total()); err != cudaSuccess) return err;
  int M = a.N * (a.H / kBlock) * (a.W / kBlock);
  unsigned grid = static_cast<unsigned>((M + kPixels - 1) / kPixels);
  return launch_kernel<space_to_depth_conv_kernel<T, kTilesN>>(grid, kThreads, s.total(), stream,
                                                               a.programmatic_launch, a, s);
}

template <typename T>
cudaError_t launch_for_k(SpaceToDepthConvArgs const& a, cudaStream_t stream) {
  switch (a.K) {
    case 32: return launch_typed<T, 2>(a, stream);
    case 64: return launch_typed<T, 4>(a, stream);
    case 128: return launch_typed<T, 8>(a, stream);
    default: return cudaErrorInvalidValue;  // kernel_supports() said no
  }
}

}  // namespace

bool kernel_supports(DType dtype, int cc, int C, int K) {
  return cc >= (dtype == DType::kBF16 ? 80 : 70) && C >= 1 && C <= kMaxC &&
         (K == 32 || K == 64 || K == 128);
}

cudaError_t launch_space_to_depth_conv(SpaceToDepthConvArgs const& a, cudaStream_t stream) {
  return a.dtype == DType::kF16 ? launch_for_k<__half>(a, stream)
                                : launch_for_k<__nv_bfloat16>(a, stream);
}

}  // namespace space_to_depth_conv
}  // namespace cutlass_ops
