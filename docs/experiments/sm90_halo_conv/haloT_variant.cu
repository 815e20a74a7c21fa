// halo_variant.cu with the GEMM transposed: M = 64 output channels (the filter tap is wgmma's A),
// N = 128 pixels (the shifted copy is B), m64n128k16: a quarter of the SM's shared-memory bandwidth
// left free where m64n64k16 used all of it (README.md).  The epilogue transposes back through
// shared memory.  HALO_WAIT0=1: wait for each copy's MMAs before the next batch (no C7514).
//
// A 3x3 stride-1 conv (pad 1) for sm90 that reads each input tile once, with its halo, instead of
// nine times through im2col.  A variant of the sm90_conv3x_fprop sweep (same driver, same checks).
//
// Why: at N=2048, 16x16, 64->64 every im2col-based kernel measured so far (CUTLASS stock and
// persistent, cuDNN) takes 103-109 us, about 2.5x the HBM and tensor-core floors (~40 us each).
// Their L2->SM traffic is about 0.9 GB for that conv (A: 9 shifted 128x64 tiles a tile, B: the
// whole 64x576 filter a tile), i.e. ~8.5 TB/s over 108 us: the L2 is the limit.
//
// How: a CTA tile is TH whole output rows of one image (M = TH*W pixels).  For each horizontal
// filter tap s the producer loads ONE copy of the input rows y0-1 .. y0+TH, shifted by s-1
// columns (TMA tiled mode; out-of-image rows/columns arrive as zeros), [(TH+2)*W][C] with the
// 128-byte swizzle.  Output pixel m = y*W + x then needs, for tap (r, s), copy_s row m + r*W:
// the A operand of that tap is the copy's rows [r*W, r*W + M), an affine view whose start is a
// multiple of 8 rows (W % 8 == 0), so the swizzle phase is the same and wgmma reads it with a
// plain descriptor.  3 copies of (TH+2)/TH of the tile replace 9 im2col tiles; the filter
// (9 x K x C) stays in shared memory for the CTA's life (persistent grid).
//
// Warp roles: warp group 0 = producer (one thread issues every TMA), groups 1 and 2 = consumers,
// each owning every other tile of the CTA (so one group's epilogue runs under the other's MMAs).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include <cstdio>
#include <string>

#include "sweep_common.h"

#ifndef HALO_TH
#define HALO_TH 8  // output rows per tile
#endif
#ifndef HALO_STAGES
#define HALO_STAGES 6  // input copies in flight (3 a tile)
#endif
#ifndef HALO_WAIT0
#define HALO_WAIT0 0  // 1: wait for each copy's MMAs before the next batch
#endif
#ifndef HALO_VID
#define HALO_VID haloT_t128x64_s6
#endif
#define HALO_STR2(x) #x
#define HALO_STR(x) HALO_STR2(x)

namespace HALO_VID {
using namespace cute;

constexpr int kW = 16, kH = 16, kC = 64, kK = 64;  // the block-0 problem; W % 8 == 0 is what the trick needs
constexpr int kTH = HALO_TH;
constexpr int kM = kTH * kW;
constexpr int kRows = (kTH + 2) * kW;
constexpr int kStages = HALO_STAGES;
constexpr int kCopyBytes = kRows * kC * 2;
constexpr int kTapBytes = kK * kC * 2;
static_assert(kH % kTH == 0 && kW % 8 == 0 && kM % 64 == 0, "tile shape");

using SmemAtom = GMMA::Layout_K_SW128_Atom<half_t>;  // 8 rows x 64 halves, 128-byte swizzle (= TMA's)
using ALayout = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kM>, Int<kC>>{}));
using BLayout = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kK>, Int<kC>>{}));
using TiledMma = decltype(make_tiled_mma(SM90_64x128x16_F32F16F16_SS<GMMA::Major::K, GMMA::Major::K>{}));
static_assert(kM == 128 && kK == 64, "the transposed form: M = 64 output channels, N = 128 pixels");

struct Smem {
  alignas(1024) half_t b[9][kK * kC];       // the filter, one K x C tile per tap (r*3+s)
  alignas(1024) half_t a[kStages][kRows * kC];  // shifted input copies
  alignas(1024) half_t stage_out[2][kM * kK];  // each consumer's output tile, pixel-major, 16-byte chunks swizzled
  alignas(8) uint64_t full[kStages];
  uint64_t empty[kStages];
  uint64_t b_full;
};

using FullBarrier = cutlass::arch::ClusterTransactionBarrier;
using EmptyBarrier = cutlass::arch::ClusterBarrier;
constexpr uint64_t kHint = static_cast<uint64_t>(TMA::CacheHintSm90::EVICT_NORMAL);

__global__ void __launch_bounds__(384, 1)
    halo_conv_kernel(__grid_constant__ CUtensorMap const tmap_x, __grid_constant__ CUtensorMap const tmap_w,
                     half_t* __restrict__ y, int tiles) {
  extern __shared__ char smem_raw[];
  Smem& s = *reinterpret_cast<Smem*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  int const wg = threadIdx.x / 128;
  int const local_tiles = (tiles - int(blockIdx.x) + int(gridDim.x) - 1) / int(gridDim.x);

  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) {
      FullBarrier::init(&s.full[i], 1);
      EmptyBarrier::init(&s.empty[i], 128);  // every thread of the consuming group arrives
    }
    FullBarrier::init(&s.b_full, 1);
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  if (wg == 0) {
    if (threadIdx.x == 0) {
      cute::prefetch_tma_descriptor(&tmap_x);
      cute::prefetch_tma_descriptor(&tmap_w);
      FullBarrier::arrive_and_expect_tx(&s.b_full, 9 * kTapBytes);
      for (int rs = 0; rs < 9; ++rs) SM90_TMA_LOAD_2D::copy(&tmap_w, &s.b_full, kHint, s.b[rs], rs * kC, 0);
      int it = 0;
      for (int j = 0; j < local_tiles; ++j) {
        int const t = int(blockIdx.x) + j * int(gridDim.x);
        int const n = t / (kH / kTH), y0 = (t % (kH / kTH)) * kTH;
        for (int tap_s = 0; tap_s < 3; ++tap_s, ++it) {
          int const st = it % kStages, ph = (it / kStages) & 1;
          EmptyBarrier::wait(&s.empty[st], ph ^ 1);
          FullBarrier::arrive_and_expect_tx(&s.full[st], kCopyBytes);
          SM90_TMA_LOAD_4D::copy(&tmap_x, &s.full[st], kHint, s.a[st], 0, tap_s - 1, y0 - 1, n);
        }
      }
    }
    return;
  }

  int const consumer = wg - 1;
  TiledMma mma;
  auto thr = mma.get_thread_slice(threadIdx.x - 128 * wg);
  Tensor acc = partition_fragment_C(mma, Shape<Int<kK>, Int<kM>>{});  // (channel, pixel)
  FullBarrier::wait(&s.b_full, 0);
  for (int j = consumer; j < local_tiles; j += 2) {
    int const t = int(blockIdx.x) + j * int(gridDim.x);
    clear(acc);
    warpgroup_fence_operand(acc);
    for (int tap_s = 0; tap_s < 3; ++tap_s) {
      int const it = 3 * j + tap_s, st = it % kStages, ph = (it / kStages) & 1;
      FullBarrier::wait(&s.full[st], ph);
      warpgroup_fence_operand(acc);
      warpgroup_arrive();
#pragma unroll
      for (int r = 0; r < 3; ++r) {
        Tensor sA = make_tensor(make_smem_ptr(s.a[st] + r * kW * kC), ALayout{});
        Tensor sB = make_tensor(make_smem_ptr(s.b[r * 3 + tap_s]), BLayout{});
        Tensor tA = thr.make_fragment_A(thr.partition_A(sB));  // weights are the M operand
        Tensor tB = thr.make_fragment_B(thr.partition_B(sA));  // pixels the N operand
        gemm(mma, tA, tB, acc);
      }
      warpgroup_commit_batch();
#if HALO_WAIT0
      warpgroup_wait<0>();  // this copy's MMAs are done (the other consumer group keeps the tensor cores busy)
      warpgroup_fence_operand(acc);
      EmptyBarrier::arrive(&s.empty[it % kStages]);
#else
      warpgroup_wait<1>();  // the previous copy's MMAs are done once at most one batch is in flight
      warpgroup_fence_operand(acc);
      if (tap_s > 0) EmptyBarrier::arrive(&s.empty[(it - 1) % kStages]);
#endif
    }
#if !HALO_WAIT0
    warpgroup_wait<0>();
    EmptyBarrier::arrive(&s.empty[(3 * j + 2) % kStages]);
#endif
    warpgroup_fence_operand(acc);

    // Epilogue: acc is (channel, pixel); transpose through shared memory (16-byte chunks XOR-swizzled
    // by pixel % 8: conflict-free both ways), then 16-byte stores of whole pixel rows.
    int const ct = threadIdx.x - 128 * wg;
    half_t* buf = s.stage_out[consumer];
    cutlass::arch::NamedBarrier::sync(128, 1 + consumer);  // the previous tile's reads are done
    // The wgmma accumulator layout (m64nNk16, fp32): value v0 + 2*v1 + 4*v2 of thread (warp w, lane l)
    // is channel 16w + l/4 + 8*v1, pixel 2*(l%4) + v0 + 8*v2.
    // The swizzled chunk depends on (v0, v1) only (8*v2 leaves pixel % 8 alone): four base addresses.
    int const ch0 = (ct / 32) * 16 + (ct % 32) / 4, px0 = 2 * (ct % 4);
#pragma unroll
    for (int v1 = 0; v1 < 2; ++v1)
#pragma unroll
      for (int v0 = 0; v0 < 2; ++v0) {
        int const ch = ch0 + 8 * v1, px = px0 + v0;
        half_t* base = buf + px * kK + ((((ch >> 3) ^ (px & 7)) << 3) | (ch & 7));
#pragma unroll
        for (int v2 = 0; v2 < kM / 8; ++v2) base[8 * v2 * kK] = half_t(acc(v0 + 2 * v1 + 4 * v2));
      }
    cutlass::arch::NamedBarrier::sync(128, 1 + consumer);
    uint4* dst = reinterpret_cast<uint4*>(y + size_t(t) * kM * kK);
#pragma unroll
    for (int i = ct; i < kM * kK / 8; i += 128) {
      int const px = i / (kK / 8), c = i % (kK / 8);
      dst[i] = *reinterpret_cast<uint4 const*>(buf + px * kK + ((c ^ (px & 7)) << 3));
    }
  }
}

// cuTensorMapEncodeTiled through the runtime (no -lcuda).
PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      p = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

constexpr int kSmemBytes = int(sizeof(Smem)) + 1024;  // + alignment slack

sweep::VariantInfo info() {
  sweep::VariantInfo v{};
  v.name = HALO_STR(HALO_VID);
  char d[160];
  snprintf(d, sizeof d, "halo (transposed: M=channels) tile %dx%d rows x W=%d, %d copy stages, filter resident, persistent, 1 producer + 2 consumer WGs",
           kTH, kW, kW, kStages);
  v.desc = d;
  v.tm = kM, v.tn = kK, v.tk = kC, v.cm = v.cn = 1, v.stages = kStages;
  v.smem_bytes = kSmemBytes, v.threads = 384, v.min_blocks = 1;
  cudaFuncAttributes a{};
  if (cudaFuncGetAttributes(&a, halo_conv_kernel) == cudaSuccess) v.regs = a.numRegs, v.local_bytes = int(a.localSizeBytes);
  cudaFuncSetAttribute(halo_conv_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v.ctas_per_sm, halo_conv_kernel, 384, kSmemBytes);
  return v;
}

struct RunnerImpl : sweep::Runner {
  CUtensorMap tx{}, tw{};
  half_t* y = nullptr;
  int tiles = 0, grid = 0;

  bool init(sweep::Problem const& p, half const* x, half const* w, half* yy, std::string& why) override {
    if (!(p.h == kH && p.w == kW && p.c == kC && p.k == kK && p.r == 3 && p.stride == 1 && p.pad == 1)) {
      why = "only 16x16 64->64 3x3/1 pad 1";
      return false;
    }
    auto enc = encode_fn();
    if (!enc) { why = "no cuTensorMapEncodeTiled"; return false; }
    {
      cuuint64_t dims[4] = {cuuint64_t(kC), cuuint64_t(kW), cuuint64_t(kH), cuuint64_t(p.n)};
      cuuint64_t strides[3] = {cuuint64_t(kC) * 2, cuuint64_t(kW) * kC * 2, cuuint64_t(kH) * kW * kC * 2};
      cuuint32_t box[4] = {cuuint32_t(kC), cuuint32_t(kW), cuuint32_t(kTH + 2), 1};
      cuuint32_t estr[4] = {1, 1, 1, 1};
      CUresult r = enc(&tx, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4, const_cast<half*>(x), dims, strides, box, estr,
                       CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                       CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
      if (r != CUDA_SUCCESS) { why = "tensor map x: " + std::to_string(int(r)); return false; }
    }
    {
      cuuint64_t dims[2] = {cuuint64_t(9 * kC), cuuint64_t(kK)};
      cuuint64_t strides[1] = {cuuint64_t(9 * kC) * 2};
      cuuint32_t box[2] = {cuuint32_t(kC), cuuint32_t(kK)};
      cuuint32_t estr[2] = {1, 1};
      CUresult r = enc(&tw, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, const_cast<half*>(w), dims, strides, box, estr,
                       CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                       CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
      if (r != CUDA_SUCCESS) { why = "tensor map w: " + std::to_string(int(r)); return false; }
    }
    y = reinterpret_cast<half_t*>(yy);
    tiles = p.n * (kH / kTH);
    int dev = 0, sms = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    grid = tiles < sms ? tiles : sms;
    cudaFuncSetAttribute(halo_conv_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
    return true;
  }
  long long grid_ctas() const override { return grid; }
  cudaError_t run(cudaStream_t stream, int launches) override {
    for (int i = 0; i < launches; ++i) halo_conv_kernel<<<grid, 384, kSmemBytes, stream>>>(tx, tw, y, tiles);
    return cudaGetLastError();
  }
};

sweep::Runner* make_runner() { return new RunnerImpl(); }
sweep::Registrar reg({HALO_STR(HALO_VID), &info, &make_runner});

}  // namespace HALO_VID
