// The halo kernels' shared pieces (sm_90a): shared memory, the TMA producer and the consumers'
// per-tile MMAs.  Two kernels use them: conv2d_fused_sm90_halo.cu (the conv with conv2d_fused's
// epilogue, a tile at a time) and conv2d_fused_sm90_halo_se_gate.cu (the conv with se_gate as its
// epilogue, an image at a time).
//
// A tile is 8 whole output rows of one image (128 pixels, contiguous in NHWC).  For each
// horizontal tap s the producer loads one copy of input rows y0-1 .. y0+8 shifted by s-1
// columns (TMA tiled mode; rows and columns outside the image arrive as zeros): [10*16][64] with
// the 128-byte swizzle.  Output pixel m = y*16 + x needs copy_s row m + 16r for tap (r, s), so
// that tap's operand is the copy's rows [16r, 16r + 128): a plain wgmma descriptor, since 16r
// rows is a whole number of swizzle atoms.  The filter (9 taps of 64x64) stays in shared memory
// for the CTA's life (persistent grid).
//
// The GEMM is transposed, D^T[channel][pixel] = W[channel][c] * X^T[c][pixel] (wgmma M = 64
// output channels, N = 128 pixels): with N = 64 the A and B reads of every m64n64k16 use all of
// the SM's shared-memory bandwidth, with N = 128 three quarters (the experiment: 108 -> 66 us
// at N=2048, block 0 of FusedResNet, H100).
//
// Warp group 0 is the producer (one thread issues every TMA); groups 1 and 2 are consumers.
// Each consumer waits for a copy's MMAs before the next batch (wgmma.wait_group 0): with one
// batch in flight ptxas serialized the wgmmas (C7514) and the kernel measured 74 us, not 66.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cute/arch/copy_sm90_tma.hpp"
#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/bfloat16.h"
#include "cutlass/half.h"

#include "common/programmatic_launch.cuh"

namespace cutlass_ops {
namespace conv2d_fused {
namespace sm90_halo {

using namespace cute;

constexpr int kW = 16, kC = 64, kK = 64;  // W % 8 == 0 is what the shifted views need
constexpr int kTileRows = 8;
constexpr int kM = kTileRows * kW;             // 128 pixels a tile
constexpr int kCopyRows = (kTileRows + 2) * kW;  // 160 input pixels a copy
constexpr int kStages = 6;                     // copies in flight (3 a tile)
constexpr int kThreads = 384;
constexpr int kCopyBytes = kCopyRows * kC * 2;
constexpr int kTapBytes = kK * kC * 2;
constexpr int kMaxHidden = 16;                 // the SE epilogue's excite width R (se_gate kernel)

using SmemAtom = GMMA::Layout_K_SW128_Atom<half_t>;  // 8 rows x 128 bytes, TMA's 128-byte swizzle
using PixelLayout = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kM>, Int<kC>>{}));
using FilterLayout = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kK>, Int<kC>>{}));

template <typename T> struct Mma;
template <> struct Mma<half_t> {
  using Atom = SM90_64x128x16_F32F16F16_SS<GMMA::Major::K, GMMA::Major::K>;
  static constexpr CUtensorMapDataType kTmaType = CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
};
template <> struct Mma<bfloat16_t> {
  using Atom = SM90_64x128x16_F32BF16BF16_SS<GMMA::Major::K, GMMA::Major::K>;
  static constexpr CUtensorMapDataType kTmaType = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
};

template <typename T>
struct Smem {
  alignas(1024) T filter[9][kK * kC];      // tap r*3+s: [k][c]
  alignas(1024) T copies[kStages][kCopyRows * kC];
  alignas(1024) T out[2][kM * kK];         // each consumer's tile, pixel-major, 16-byte chunks swizzled
  float se[2][kK + kMaxHidden];            // each consumer's channel sums (then its gates), and its hidden units
  alignas(8) uint64_t full[kStages];
  uint64_t empty[kStages];
  uint64_t filter_full;
};
template <typename T>
constexpr int kSmemBytes = int(sizeof(Smem<T>)) + 1024;  // + slack to align the base to 1024

using FullBarrier = cutlass::arch::ClusterTransactionBarrier;
using EmptyBarrier = cutlass::arch::ClusterBarrier;

template <typename T>
__device__ __forceinline__ Smem<T>& smem_of(char* smem_raw) {
  return *reinterpret_cast<Smem<T>*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
}

// Thread 0 sets up the barriers; the whole CTA waits for it.
template <typename T>
__device__ __forceinline__ void init_barriers(Smem<T>& s) {
  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) {
      FullBarrier::init(&s.full[i], 1);
      EmptyBarrier::init(&s.empty[i], 128);  // every thread of the consuming group arrives
    }
    FullBarrier::init(&s.filter_full, 1);
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
}

// The producer (thread 0 of warp group 0): the filter once, then for each of the CTA's
// `local_tiles` tiles, in order, its three shifted copies.  tile_at(j) gives local tile j's
// image n and first output row y0 (an int2 {n, y0}; n < 0: no such tile, skipped).
//
// Tile j's copies go to stages 3j % 6 .. + 2 with phase (j / 2) & 1: even tiles use stages
// 0-2, odd tiles 3-5, each set once every other tile.  So each consumer group must take tiles
// of one parity only, in order (mma_tile): an mbarrier's parity wait cannot tell phase k from
// phase k + 2, and a group that waited on a stage two phases ahead of the other group's use of
// it would read that stage before its copy landed.
template <typename T, typename TileAt>
__device__ __forceinline__ void produce(Smem<T>& s, CUtensorMap const& tmap_x, CUtensorMap const& tmap_w,
                                        int local_tiles, TileAt tile_at) {
  uint64_t const hint = static_cast<uint64_t>(TMA::CacheHintSm90::EVICT_NORMAL);
  prefetch_tma_descriptor(&tmap_x);
  prefetch_tma_descriptor(&tmap_w);
  FullBarrier::arrive_and_expect_tx(&s.filter_full, 9 * kTapBytes);
  for (int tap = 0; tap < 9; ++tap) SM90_TMA_LOAD_2D::copy(&tmap_w, &s.filter_full, hint, s.filter[tap], tap * kC, 0);
  for (int j = 0; j < local_tiles; ++j) {
    int2 const tile = tile_at(j);
    if (tile.x < 0) continue;
    for (int tap_s = 0; tap_s < 3; ++tap_s) {
      int const it = 3 * j + tap_s, st = it % kStages, phase = (it / kStages) & 1;
      EmptyBarrier::wait(&s.empty[st], phase ^ 1);
      FullBarrier::arrive_and_expect_tx(&s.full[st], kCopyBytes);
      SM90_TMA_LOAD_4D::copy(&tmap_x, &s.full[st], hint, s.copies[st], 0, tap_s - 1, tile.y - 1, tile.x);
    }
  }
}

// The MMAs of local tile j (the producer's order) into acc, a consumer group's (channel,
// pixel) fragment; each copy goes back to the producer once its MMAs are done.  The caller
// clears acc first (or accumulates on purpose) and has waited for the filter.  A consumer group
// takes tiles of one parity, in increasing order (produce).
template <typename T, typename ThrMma, typename Acc>
__device__ __forceinline__ void mma_tile(Smem<T>& s, ThrMma const& thr, Acc& acc, int j) {
  using TiledMma = decltype(make_tiled_mma(typename Mma<T>::Atom{}));
  TiledMma mma;
  warpgroup_fence_operand(acc);
  for (int tap_s = 0; tap_s < 3; ++tap_s) {
    int const it = 3 * j + tap_s, st = it % kStages, phase = (it / kStages) & 1;
    FullBarrier::wait(&s.full[st], phase);
    warpgroup_fence_operand(acc);
    warpgroup_arrive();
#pragma unroll
    for (int r = 0; r < 3; ++r) {
      Tensor pixels = make_tensor(make_smem_ptr(s.copies[st] + r * kW * kC), PixelLayout{});
      Tensor filter = make_tensor(make_smem_ptr(s.filter[r * 3 + tap_s]), FilterLayout{});
      gemm(mma, thr.make_fragment_A(thr.partition_A(filter)), thr.make_fragment_B(thr.partition_B(pixels)), acc);
    }
    warpgroup_commit_batch();
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc);
    EmptyBarrier::arrive(&s.empty[st]);
  }
}

// The wgmma accumulator layout (m64nNk16, fp32): value v0 + 2*v1 + 4*v2 of thread (warp w,
// lane l) of a consumer group is channel 16w + l/4 + 8*v1, pixel 2*(l%4) + v0 + 8*v2.
__device__ __forceinline__ int acc_channel0(int ct) { return (ct / 32) * 16 + (ct % 32) / 4; }
__device__ __forceinline__ int acc_pixel0(int ct) { return 2 * (ct % 4); }

// Element (pixel, channel) of a consumer's out tile: pixel-major, 16-byte chunks XOR-swizzled
// by pixel % 8 (conflict-free for the accumulator stores and the row-wise 16-byte reads).
__device__ __forceinline__ int out_index(int px, int ch) { return px * kK + ((((ch >> 3) ^ (px & 7)) << 3) | (ch & 7)); }
__device__ __forceinline__ int out_chunk(int px, int chunk) { return px * kK + ((chunk ^ (px & 7)) << 3); }

// Host side ------------------------------------------------------------------------------

// cuTensorMapEncodeTiled through the runtime: the library does not link libcuda.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 const fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      p = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

inline bool aligned16(void const* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The input's and the filter's tensor maps (NHWC input of N images of H x 16 x 64; KRSC
// filter 64 x 3 x 3 x 64).  False when the driver entry point is missing or refuses them.
template <typename T>
bool encode_maps(void const* input, void const* weight, int N, int H, CUtensorMap& tmap_x, CUtensorMap& tmap_w) {
  auto encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  {  // input NHWC as (c, w, h, n); a box is one shifted copy (10 rows of 16 pixels)
    cuuint64_t dims[4] = {cuuint64_t(kC), cuuint64_t(kW), cuuint64_t(H), cuuint64_t(N)};
    cuuint64_t strides[3] = {cuuint64_t(kC) * 2, cuuint64_t(kW) * kC * 2, cuuint64_t(H) * kW * kC * 2};
    cuuint32_t box[4] = {cuuint32_t(kC), cuuint32_t(kW), cuuint32_t(kTileRows + 2), 1};
    cuuint32_t elem_strides[4] = {1, 1, 1, 1};
    if (encode(&tmap_x, Mma<T>::kTmaType, 4, const_cast<void*>(input), dims, strides, box, elem_strides,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
      return false;
  }
  {  // filter KRSC as (r*s*c, k); a box is one tap
    cuuint64_t dims[2] = {cuuint64_t(9 * kC), cuuint64_t(kK)};
    cuuint64_t strides[1] = {cuuint64_t(9 * kC) * 2};
    cuuint32_t box[2] = {cuuint32_t(kC), cuuint32_t(kK)};
    cuuint32_t elem_strides[2] = {1, 1};
    if (encode(&tmap_w, Mma<T>::kTmaType, 2, const_cast<void*>(weight), dims, strides, box, elem_strides,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
      return false;
  }
  return true;
}

// The SM count of the current device, 0 on error.
inline int current_sm_count() {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    return 0;
  return sms;
}

// Launches kKernel (a halo kernel of element type T: kernel(tmap_x, tmap_w, ep)) over N images
// of H rows on a persistent grid of min(work_items, SMs) CTAs: the tensor maps, the shared
// memory attribute (once per kernel), the launch (launch_kernel: a programmatic dependent of the
// previous kernel when `programmatic`).  kErrorNotSupported when the maps cannot be made,
// kErrorInternal for a failed launch.
template <auto kKernel, typename T, typename Ep>
cutlass::Status launch_halo(void const* input, void const* weight, int N, int H, int work_items, Ep const& ep,
                            cudaStream_t stream, bool programmatic) {
  CUtensorMap tmap_x{}, tmap_w{};
  if (!encode_maps<T>(input, weight, N, H, tmap_x, tmap_w)) return cutlass::Status::kErrorNotSupported;
  static bool const smem_set =
      cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes<T>) == cudaSuccess;
  if (!smem_set) return cutlass::Status::kErrorInternal;
  int const sms = current_sm_count();
  if (sms == 0) return cutlass::Status::kErrorInternal;
  int const grid = work_items < sms ? work_items : sms;
  cudaError_t err = launch_kernel<kKernel>(dim3(grid), dim3(kThreads), kSmemBytes<T>, stream, programmatic, tmap_x,
                                           tmap_w, ep);
  return err == cudaSuccess ? cutlass::Status::kSuccess : cutlass::Status::kErrorInternal;
}

}  // namespace sm90_halo
}  // namespace conv2d_fused
}  // namespace cutlass_ops
