#include "space_to_depth_conv/space_to_depth_conv_kernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "common/dynamic_smem.h"
#include "common/programmatic_launch.cuh"
#include "space_to_depth_conv/space_to_depth_conv_fast.cuh"
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

// sm80+: the persistent cp.async + mma.sync kernel (space_to_depth_conv_fast.cuh).
// No min-blocks hint: capping K=64 at 80 registers (three CTAs an SM) spills on sm90;
// two CTAs (16 warps, up to 3 tiles each in flight) already keep ~70 KB of reads in flight.
template <typename T, int kTilesN>
__global__ void __launch_bounds__(32 * fast::kMaxWarps) space_to_depth_conv_fast_kernel(fast::FastParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // cp.async and mma.m16n8k16 need sm80; launched only there (launch_for_k)
#else
  wait_for_previous_grid();
  extern __shared__ __align__(128) unsigned char smem[];
  fast::fast_body<T, 16 * kTilesN>(p, smem, threadIdx.x);
#endif
}

// Launches the fast kernel, or returns cudaErrorNotSupported (nothing launched) where its
// shared memory does not fit the device.
template <typename T, int kTilesN>
cudaError_t launch_fast(SpaceToDepthConvArgs const& a, int device, cudaStream_t stream) {
  constexpr int K = 16 * kTilesN;
  auto kernel = space_to_depth_conv_fast_kernel<T, kTilesN>;
  int max_smem = 0, sms = 0;
  if (cudaError_t err = cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
      err != cudaSuccess)
    return err;
  if (cudaError_t err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device); err != cudaSuccess)
    return err;
  int warps = fast::kMaxWarps;
  while (warps > 1 && fast::smem_bytes(a.C, K, warps) > size_t(max_smem)) --warps;
  size_t const smem = fast::smem_bytes(a.C, K, warps);
  if (smem > size_t(max_smem)) return cudaErrorNotSupported;

  fast::FastParams p{};
  p.input = a.input; p.weight = a.weight; p.output = a.output; p.post_bias = a.post_bias;
  // A size-1 dimension's stride is never applied: zero, so it cannot spoil the alignment test.
  p.stride_n = a.N == 1 ? 0 : a.stride_n;
  p.stride_c = a.C == 1 ? 0 : a.stride_c;
  p.stride_h = a.stride_h; p.stride_w = a.stride_w;
  p.C = a.C; p.P = a.H / kBlock; p.Q = a.W / kBlock; p.M = a.N * p.P * p.Q;
  p.warps = warps;
  p.relu = a.relu;
  auto const addr = reinterpret_cast<std::uintptr_t>(a.input);
  auto all_multiple = [&](int64_t e) {
    return p.stride_n % e == 0 && p.stride_c % e == 0 && p.stride_h % e == 0 && addr % (2 * e) == 0;
  };
  p.mode = p.stride_w != 1 ? fast::kScalar
           : (a.W % 8 == 0 && all_multiple(8)) ? fast::kVec16  // pixel pairs never straddle rows
           : all_multiple(4) ? fast::kVec8 : fast::kScalar;

  if (cudaError_t err = allow_dynamic_smem(kernel, smem); err != cudaSuccess) return err;
  // CTAs per SM, per (device, warps, shared memory): the occupancy query, once.
  static std::mutex mutex;
  static std::map<std::tuple<int, int, size_t>, int> per_sm_cache;
  int per_sm = 0;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto key = std::make_tuple(device, warps, smem);
    auto it = per_sm_cache.find(key);
    if (it != per_sm_cache.end()) {
      per_sm = it->second;
    } else {
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 32 * warps, smem) != cudaSuccess ||
          per_sm < 1) {
        cudaGetLastError();  // not this launch's error: one CTA per SM
        per_sm = 1;
      }
      per_sm_cache.emplace(key, per_sm);
    }
  }
  long long const tiles = (static_cast<long long>(p.M) + fast::kTileM - 1) / fast::kTileM;
  long long const needed = (tiles + warps - 1) / warps, cap = static_cast<long long>(sms) * per_sm;
  unsigned const grid = static_cast<unsigned>(needed < cap ? needed : cap);
  return launch_kernel<space_to_depth_conv_fast_kernel<T, kTilesN>>(grid, 32 * warps, smem, stream,
                                                                    a.programmatic_launch, p);
}

template <typename T, int kTilesN>
cudaError_t launch_typed(SpaceToDepthConvArgs const& a, cudaStream_t stream) {
  int device = 0, major = 0;
  if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return err;
  if (cudaError_t err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device); err != cudaSuccess)
    return err;
  if (major >= 8) {
    cudaError_t err = launch_fast<T, kTilesN>(a, device, stream);
    if (err != cudaErrorNotSupported) return err;
  }
  // sm70/75 (fp16), or too little shared memory for the fast kernel: the WMMA kernel.
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
