// conv2d_fused for 3x3 / stride 1 / pad 1, C = K = 64, W = 16 on sm_90a: the input tile is read
// once with its halo, not nine times through im2col.
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
// at N=2048, block 0 of FusedResNet, H100).  The epilogue transposes back through shared
// memory and writes whole pixel rows with 16-byte stores.
//
// Warp group 0 is the producer (one thread issues every TMA); groups 1 and 2 are consumers,
// each owning every other tile of the CTA, so one group's epilogue runs under the other's MMAs.
// Each consumer waits for a copy's MMAs before the next batch (wgmma.wait_group 0): with one
// batch in flight ptxas serialized the wgmmas (C7514) and the kernel measured 74 us, not 66.
#include "conv2d_fused/conv2d_fused_sm90_halo.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/programmatic_launch.cuh"
#include "cute/arch/copy_sm90_tma.hpp"
#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/bfloat16.h"
#include "cutlass/half.h"

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
  alignas(8) uint64_t full[kStages];
  uint64_t empty[kStages];
  uint64_t filter_full;
};
template <typename T>
constexpr int kSmemBytes = int(sizeof(Smem<T>)) + 1024;  // + slack to align the base to 1024

struct Epilogue {
  void* output;
  float const* bias;         // [K] or null
  float const* bias_scalar;  // or null
  float const* scale;        // or null
  float const* post_bias;    // or null
  int relu;
  int tiles;                 // N * H / kTileRows
  int tiles_per_image;       // H / kTileRows
};

using FullBarrier = cutlass::arch::ClusterTransactionBarrier;
using EmptyBarrier = cutlass::arch::ClusterBarrier;

template <typename T>
__global__ void __launch_bounds__(kThreads, 1)
    halo_conv_kernel(__grid_constant__ CUtensorMap const tmap_x, __grid_constant__ CUtensorMap const tmap_w,
                     Epilogue const ep) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ char smem_raw[];
  Smem<T>& s = *reinterpret_cast<Smem<T>*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  int const wg = threadIdx.x / 128;
  int const local_tiles = (ep.tiles - int(blockIdx.x) + int(gridDim.x) - 1) / int(gridDim.x);
  uint64_t const hint = static_cast<uint64_t>(TMA::CacheHintSm90::EVICT_NORMAL);

  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) {
      FullBarrier::init(&s.full[i], 1);
      EmptyBarrier::init(&s.empty[i], 128);  // every thread of the consuming group arrives
    }
    FullBarrier::init(&s.filter_full, 1);
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
  wait_for_previous_grid();  // before the first read of the input or write of the output

  if (wg == 0) {  // the producer
    if (threadIdx.x == 0) {
      prefetch_tma_descriptor(&tmap_x);
      prefetch_tma_descriptor(&tmap_w);
      FullBarrier::arrive_and_expect_tx(&s.filter_full, 9 * kTapBytes);
      for (int tap = 0; tap < 9; ++tap)
        SM90_TMA_LOAD_2D::copy(&tmap_w, &s.filter_full, hint, s.filter[tap], tap * kC, 0);
      int it = 0;
      for (int j = 0; j < local_tiles; ++j) {
        int const t = int(blockIdx.x) + j * int(gridDim.x);
        int const n = t / ep.tiles_per_image, y0 = (t % ep.tiles_per_image) * kTileRows;
        for (int tap_s = 0; tap_s < 3; ++tap_s, ++it) {
          int const st = it % kStages, phase = (it / kStages) & 1;
          EmptyBarrier::wait(&s.empty[st], phase ^ 1);
          FullBarrier::arrive_and_expect_tx(&s.full[st], kCopyBytes);
          SM90_TMA_LOAD_4D::copy(&tmap_x, &s.full[st], hint, s.copies[st], 0, tap_s - 1, y0 - 1, n);
        }
      }
    }
    return;
  }

  // The consumers.  acc is (channel, pixel) of the transposed GEMM.
  int const consumer = wg - 1, ct = threadIdx.x - 128 * wg;
  using TiledMma = decltype(make_tiled_mma(typename Mma<T>::Atom{}));
  TiledMma mma;
  auto thr = mma.get_thread_slice(ct);
  Tensor acc = partition_fragment_C(mma, Shape<Int<kK>, Int<kM>>{});

  // The wgmma accumulator layout (m64nNk16, fp32): value v0 + 2*v1 + 4*v2 of thread (warp w,
  // lane l) is channel 16w + l/4 + 8*v1, pixel 2*(l%4) + v0 + 8*v2.  Per-channel epilogue
  // operands are two values a thread.
  int const ch0 = (ct / 32) * 16 + (ct % 32) / 4, px0 = 2 * (ct % 4);
  float const scale = ep.scale ? *ep.scale : 1.f;
  float const bias_scalar = ep.bias_scalar ? *ep.bias_scalar : 0.f;
  float const post_bias = ep.post_bias ? *ep.post_bias : 0.f;
  float bias[2];
  for (int v1 = 0; v1 < 2; ++v1) bias[v1] = ep.bias ? ep.bias[ch0 + 8 * v1] : 0.f;
  T* out_buf = s.out[consumer];

  FullBarrier::wait(&s.filter_full, 0);
  for (int j = consumer; j < local_tiles; j += 2) {
    int const t = int(blockIdx.x) + j * int(gridDim.x);
    clear(acc);
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

    // Epilogue: y = act(scale * acc + bias[k] + bias_scalar) + post_bias in float32, one
    // rounding; transposed through shared memory (16-byte chunks XOR-swizzled by pixel % 8:
    // conflict-free both ways), then whole pixel rows with 16-byte stores.
    cutlass::arch::NamedBarrier::sync(128, 1 + consumer);  // this group's reads of the last tile are done
#pragma unroll
    for (int v1 = 0; v1 < 2; ++v1)
#pragma unroll
      for (int v0 = 0; v0 < 2; ++v0) {
        int const ch = ch0 + 8 * v1, px = px0 + v0;
        // The swizzled chunk depends on (v0, v1) only (8*v2 leaves pixel % 8 alone).
        T* dst = out_buf + px * kK + ((((ch >> 3) ^ (px & 7)) << 3) | (ch & 7));
        float const b = bias[v1] + bias_scalar;
#pragma unroll
        for (int v2 = 0; v2 < kM / 8; ++v2) {
          float v = fmaf(scale, acc(v0 + 2 * v1 + 4 * v2), b);
          if (ep.relu && v < 0.f) v = 0.f;  // NaN stays NaN, like torch.relu
          dst[8 * v2 * kK] = T(v + post_bias);
        }
      }
    cutlass::arch::NamedBarrier::sync(128, 1 + consumer);
    uint4* y = reinterpret_cast<uint4*>(static_cast<T*>(ep.output) + size_t(t) * kM * kK);
#pragma unroll
    for (int i = ct; i < kM * kK / 8; i += 128) {
      int const px = i / (kK / 8), c = i % (kK / 8);
      y[i] = *reinterpret_cast<uint4 const*>(out_buf + px * kK + ((c ^ (px & 7)) << 3));
    }
  }
#endif
}

// cuTensorMapEncodeTiled through the runtime: the library does not link libcuda.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
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

bool aligned16(void const* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <typename T>
cutlass::Status run(Conv2dFusedArgs const& a, cudaStream_t stream) {
  bool const fits = a.C == kC && a.K == kK && a.R == 3 && a.S == 3 && a.stride_h == 1 && a.stride_w == 1 &&
                    a.pad_h == 1 && a.pad_w == 1 && a.W == kW && a.Q == kW && a.P == a.H && a.H % kTileRows == 0 &&
                    a.N >= 1 && a.residual == nullptr && a.act != Activation::kSilu && a.split_k_slices <= 1 &&
                    aligned16(a.input) && aligned16(a.weight) && aligned16(a.output);
  if (!fits) return cutlass::Status::kErrorNotSupported;
  auto encode = tensor_map_encoder();
  if (encode == nullptr) return cutlass::Status::kErrorNotSupported;
  CUtensorMap tmap_x{}, tmap_w{};
  {  // input NHWC as (c, w, h, n); a box is one shifted copy (10 rows of 16 pixels)
    cuuint64_t dims[4] = {cuuint64_t(kC), cuuint64_t(kW), cuuint64_t(a.H), cuuint64_t(a.N)};
    cuuint64_t strides[3] = {cuuint64_t(kC) * 2, cuuint64_t(kW) * kC * 2, cuuint64_t(a.H) * kW * kC * 2};
    cuuint32_t box[4] = {cuuint32_t(kC), cuuint32_t(kW), cuuint32_t(kTileRows + 2), 1};
    cuuint32_t elem_strides[4] = {1, 1, 1, 1};
    if (encode(&tmap_x, Mma<T>::kTmaType, 4, const_cast<void*>(a.input), dims, strides, box, elem_strides,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
      return cutlass::Status::kErrorNotSupported;
  }
  {  // filter KRSC as (r*s*c, k); a box is one tap
    cuuint64_t dims[2] = {cuuint64_t(9 * kC), cuuint64_t(kK)};
    cuuint64_t strides[1] = {cuuint64_t(9 * kC) * 2};
    cuuint32_t box[2] = {cuuint32_t(kC), cuuint32_t(kK)};
    cuuint32_t elem_strides[2] = {1, 1};
    if (encode(&tmap_w, Mma<T>::kTmaType, 2, const_cast<void*>(a.weight), dims, strides, box, elem_strides,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
      return cutlass::Status::kErrorNotSupported;
  }
  static bool const smem_set =
      cudaFuncSetAttribute(halo_conv_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes<T>) ==
      cudaSuccess;
  if (!smem_set) return cutlass::Status::kErrorInternal;
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    return cutlass::Status::kErrorInternal;
  Epilogue ep{a.output, a.bias, a.bias_scalar, a.scale, a.post_bias, a.act == Activation::kRelu ? 1 : 0,
              a.N * (a.H / kTileRows), a.H / kTileRows};
  int const grid = ep.tiles < sms ? ep.tiles : sms;
  cudaError_t err = launch_kernel<halo_conv_kernel<T>>(dim3(grid), dim3(kThreads), kSmemBytes<T>, stream,
                                                       a.programmatic_launch, tmap_x, tmap_w, ep);
  return err == cudaSuccess ? cutlass::Status::kSuccess : cutlass::Status::kErrorInternal;
}

}  // namespace sm90_halo

const KernelEntry kHaloKernels[] = {
    {"cutlass_ops_conv2d_fused_f16_sm90_halo3x3s1_w16c64k64_align8", 90, DType::kF16, 8, sm90_halo::kM, sm90_halo::kK, sm90_halo::kC,
     sm90_halo::kStages, &sm90_halo::run<cute::half_t>},
    {"cutlass_ops_conv2d_fused_bf16_sm90_halo3x3s1_w16c64k64_align8", 90, DType::kBF16, 8, sm90_halo::kM, sm90_halo::kK, sm90_halo::kC,
     sm90_halo::kStages, &sm90_halo::run<cute::bfloat16_t>},
};
const int kNumHaloKernels = 2;

}  // namespace conv2d_fused
}  // namespace cutlass_ops
