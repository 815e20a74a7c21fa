// Included by every generated family-90 dgrad/wgrad instance (Hopper, CUTLASS 3.x, sm_90a only):
// the kernel type for one tile configuration, and running it on a Conv2dBackwardArgs.  The
// counterpart of conv2d_backward_instance.cuh (family 80), built for 90 unless
// CUTLASS_OPS_SM90_BACKWARD=OFF (tests/python/test_conv2d_backward_sm90.py passed on an H100).
//
// The kernels are CUTLASS 4.2's stock sm90 implicit-GEMM conv, configured as its own unit tests
// configure them (test/unit/conv/device_3x/{dgrad,wgrad}/sm90_conv2d_*_f16_f16_f32_tensorop_*.cu):
// cutlass::conv::kernel::ConvUniversal with the sm90 conv CollectiveBuilder's mainloop (TMA
// im2col + wgmma, one producer and one consumer warp group: KernelImplicitTmaWarpSpecializedSm90)
// and the stock LinearCombination epilogue (alpha * acc, beta = 0).
//
//   dgrad  kDgrad: A = dy (NPQK, im2col), B = w (KRSC), D = dx (NHWC) in the 16-bit dtype, alpha =
//          the FixUp scale read from a device pointer (null: 1).  TMA warp-specialized epilogue.
//          UNITY STRIDE ONLY: CUTLASS 4.2's sm90 dgrad walks dy with the im2col TMA at the
//          traversal stride as fprop does, which is the transposed conv only for stride 1; its
//          unit tests exclude strided dgrad (testbed_conv.hpp, TestAllConv's SupportStrides is
//          false for kDgrad) and its can_implement() does not refuse it, so run() below does
//          (kErrorNotSupported: the dispatcher falls through to family 80's strided kernel).
//          (The strided-dgrad kernel, KernelStridedDgradTmaWs*, is sm100-only.)
//   wgrad  kWgrad: A = dy (tiled TMA over K x N*P*Q), B = x (im2col), D = dw in float32 (KRSC,
//          not rounded), no-smem warp-specialized epilogue (as the unit tests).  GEMM M = K,
//          N = C*R*S, K = N*P*Q: a few output tiles and a very long reduction.  CUTLASS 4.2's sm90
//          conv has no split-K and no stream-K: ConvUniversal maps to the non-persistent GEMM
//          kernel (conv/kernel/sm90_implicit_gemm_tma_warpspecialized.hpp), whose scheduler must be
//          void or PersistentScheduler (gemm/kernel/sm90_gemm_tma_warpspecialized.hpp:111: no
//          StreamKScheduler), and the conv mainloop refuses the persistent schedules that the
//          stream-K kernels need (conv/dispatch_policy.hpp:81; unchanged up to CUTLASS 4.7; the
//          3.x testbed's stream-K/split-K cases are for sm100 kernels).  So parallelism comes from splitting the
//          batch: a.split_k_slices = S slices of whole images, slice i a conv of its own
//          images writing the float32 partial sums at output + i*K*R*S*C (the layout of family
//          80's parallel split-K, which the caller's weight_grad_kernel sums), the S launches
//          spread over side streams (fork/join with events on the caller's stream, so it
//          captures into CUDA graphs) so that they run concurrently.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>

#include "cutlass/cutlass.h"
#include "cutlass/kernel_hardware_info.hpp"  // before the conv builders, which use it undeclared

#include "cute/tensor.hpp"
#include "cutlass/conv/collective/collective_builder.hpp"
#include "cutlass/conv/convnd_problem_shape.hpp"
#include "cutlass/conv/convolution.h"
#include "cutlass/conv/dispatch_policy.hpp"
#include "cutlass/conv/kernel/conv_universal.hpp"
#include "cutlass/device_kernel.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/dispatch_policy.hpp"
#include "cutlass/numeric_types.h"
#include "cutlass/util/packed_stride.hpp"

#include "conv2d_backward/conv2d_backward_args.h"

namespace cutlass_ops {
namespace conv2d_backward {

// The CUTLASS kernel for one family-90 dgrad or wgrad configuration.
//   Element            cutlass::half_t or cutlass::bfloat16_t (dy, w, x; dgrad's dx).
//   ConvOp             kDgrad or kWgrad.
//   TileM, TileN, TileK  CTA tile.  dgrad: M over input pixels (N*H*W), N over C, K over
//                      (K, S, R).  wgrad: M over K, N over (C, S, R), K over N*P*Q.
//   ClusterM, ClusterN thread block cluster.
//   Stages             mainloop stages, or 0 for the builder's automatic count.
template <class Element, cutlass::conv::Operator ConvOp, int TileM, int TileN, int TileK, int ClusterM,
          int ClusterN, int Stages>
struct Sm90BackwardConv {
  static_assert(cute::is_same_v<Element, cutlass::half_t> || cute::is_same_v<Element, cutlass::bfloat16_t>,
                "family-90 dgrad/wgrad kernels are fp16 or bf16");
  static_assert(ConvOp == cutlass::conv::Operator::kDgrad || ConvOp == cutlass::conv::Operator::kWgrad,
                "Sm90BackwardConv: kDgrad or kWgrad");
  static_assert(Stages == 0 || Stages >= 2, "Stages: 0 (auto) or >= 2");

  static constexpr cutlass::conv::Operator kConvOp = ConvOp;
  static constexpr bool kWgrad = ConvOp == cutlass::conv::Operator::kWgrad;
  static constexpr int kAlignment = 128 / cutlass::sizeof_bits<Element>::value;  // 8: TMA's 16 bytes
  using ElementAccumulator = float;
  // dgrad writes dx in the 16-bit dtype; wgrad float32 partial sums (4 per 16 bytes).
  using ElementOut = cute::conditional_t<kWgrad, float, Element>;
  static constexpr int kAlignmentOut = 128 / cutlass::sizeof_bits<ElementOut>::value;
  using LayoutIn = cutlass::layout::TensorNHWC;
  using LayoutOut = cute::conditional_t<kWgrad, cutlass::layout::TensorKCSR, cutlass::layout::TensorNHWC>;
  // wgrad's N mode (C, S, R) is hierarchical, as in CUTLASS's wgrad unit tests.
  using TileShape = cute::conditional_t<
      kWgrad, cute::Shape<cute::Int<TileM>, cute::Shape<cute::Int<TileN>>, cute::Shape<cute::Int<TileK>>>,
      cute::Shape<cute::Int<TileM>, cute::Int<TileN>, cute::Shape<cute::Int<TileK>>>>;
  using ClusterShape = cute::Shape<cute::Int<ClusterM>, cute::Int<ClusterN>, cute::_1>;
  using EpilogueSchedule = cute::conditional_t<kWgrad, cutlass::epilogue::NoSmemWarpSpecialized,
                                               cutlass::epilogue::TmaWarpSpecialized>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAccumulator, float,
      ElementOut, LayoutOut, kAlignmentOut,  // C: never read (beta = 0)
      ElementOut, LayoutOut, kAlignmentOut,  // D
      EpilogueSchedule>::CollectiveOp;

  using StageCountType = cute::conditional_t<
      Stages == 0,
      cutlass::conv::collective::StageCountAutoCarveout<int(sizeof(typename CollectiveEpilogue::SharedStorage))>,
      cutlass::conv::collective::StageCount<(Stages == 0 ? 2 : Stages)>>;

  using CollectiveMainloop = typename cutlass::conv::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, kConvOp,
      Element, LayoutIn, kAlignment, Element, LayoutIn, kAlignment, ElementAccumulator,
      TileShape, ClusterShape, StageCountType,
      cutlass::conv::KernelImplicitTmaWarpSpecializedSm90>::CollectiveOp;

  using ProblemShape = cutlass::conv::ConvProblemShape<kConvOp, CollectiveMainloop::NumSpatialDimensions>;
  using Kernel = cutlass::conv::kernel::ConvUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;

  static_assert(Kernel::SharedStorageSize <= 232448,
                "tile x stages needs more shared memory than an sm90 SM has (227 KB): fewer stages");
};

namespace sm90 {

// Most batch slices one wgrad call may ask for, and the side streams they are spread over
// (per thread and device, created on first use and kept: never destroyed, so a thread that
// exits leaves its 16 streams and 17 events behind).
constexpr int kMaxWgradSlices = 64;
constexpr int kSideStreams = 16;

struct SideStreams {
  int device = -1;
  cudaStream_t streams[kSideStreams] = {};
  cudaEvent_t fork = nullptr;
  cudaEvent_t joins[kSideStreams] = {};
};

// This thread's side streams for the current device (thread-local: a graph capture on one
// thread never sees another thread's launches on them).  Null on failure.
inline SideStreams* side_streams() {
  thread_local SideStreams per_device[16];
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 16) return nullptr;
  SideStreams& s = per_device[device];
  if (s.device != device) {
    for (int i = 0; i < kSideStreams; ++i) {
      if (cudaStreamCreateWithFlags(&s.streams[i], cudaStreamNonBlocking) != cudaSuccess) return nullptr;
      if (cudaEventCreateWithFlags(&s.joins[i], cudaEventDisableTiming) != cudaSuccess) return nullptr;
    }
    if (cudaEventCreateWithFlags(&s.fork, cudaEventDisableTiming) != cudaSuccess) return nullptr;
    s.device = device;
  }
  return &s;
}

// Images [first, first + count) of batch slice `i` of `slices` (the first N % slices slices
// get one more image).
inline void slice_images(int n, int slices, int i, int& first, int& count) {
  int base = n / slices, extra = n % slices;
  count = base + (i < extra ? 1 : 0);
  first = i * base + std::min(i, extra);
}

}  // namespace sm90

template <class Config>
typename Config::Kernel::Arguments make_sm90_backward_arguments(Conv2dBackwardArgs const& a, int n_images,
                                                                 void const* grad_output, void const* input,
                                                                 void* output) {
  using Kernel = typename Config::Kernel;
  using Element = typename Kernel::ElementA;
  using ElementOut = typename Config::ElementOut;
  using ProblemShape = typename Config::ProblemShape;
  using StrideC = typename Kernel::StrideC;
  using StrideD = typename Kernel::StrideD;

  // Activation [N,H,W,C] and filter [K,R,S,C] for every kind; the problem derives dy's shape.
  ProblemShape problem(cutlass::conv::Mode::kCrossCorrelation, {n_images, a.H, a.W, a.C}, {a.K, a.R, a.S, a.C},
                       {a.pad_h, a.pad_w}, {a.pad_h, a.pad_w}, {a.stride_h, a.stride_w}, {1, 1}, /*groups*/ 1);
  StrideC stride_c{};
  StrideD stride_d{};
  if constexpr (Config::kWgrad) {
    // dw [K,R,S,C] packed: (K, (C,S,R)) with the K stride R*S*C (CUTLASS's wgrad testbed).
    stride_c = cutlass::make_cute_packed_stride(StrideC{}, problem.shape_C, problem.stride_C, Config::kConvOp);
    stride_d = cutlass::make_cute_packed_stride(StrideD{}, problem.shape_C, problem.stride_C, Config::kConvOp);
  } else {
    // dx [N,H,W,C]: ((W,H,N), C) with the pixel strides of shape_C (CUTLASS's dgrad testbed).
    cute::for_each(cute::make_seq<cute::rank<0>(StrideC{})>{}, [&](auto i) {
      cute::get<0, i>(stride_c) = problem.stride_C[ProblemShape::RankT - 2 - i];
    });
    cute::for_each(cute::make_seq<cute::rank<0>(StrideD{})>{}, [&](auto i) {
      cute::get<0, i>(stride_d) = problem.stride_C[ProblemShape::RankT - 2 - i];
    });
  }
  // Both kinds read dy as A; B is w (dgrad) or x (wgrad).
  auto const* ptr_a = static_cast<Element const*>(grad_output);
  auto const* ptr_b = static_cast<Element const*>(Config::kWgrad ? input : a.weight);
  auto* ptr_d = static_cast<ElementOut*>(output);
  typename Kernel::Arguments arguments(problem, {ptr_a, ptr_b}, {{}, ptr_d, stride_c, ptr_d, stride_d});
  auto& fusion = arguments.epilogue.thread;
  fusion.alpha = 1.0f;
  fusion.beta = 0.0f;  // C (the output itself) is never read
  // dgrad: dx = scale * acc, the scale read on the device (null: alpha = 1).  wgrad: the caller's
  // weight_grad_kernel applies the scale to the slices' sum.
  fusion.alpha_ptr = Config::kWgrad ? nullptr : a.scale;
  return arguments;
}

namespace sm90 {

template <class Config>
cutlass::Status launch(typename Config::Kernel::Params const& params, cudaStream_t stream) {
  using Kernel = typename Config::Kernel;
  auto kernel = cutlass::device_kernel<Kernel>;
  int smem = Kernel::SharedStorageSize;
  if (smem >= (48 << 10) &&
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess) {
    return cutlass::Status::kErrorInternal;
  }
  cudaLaunchAttribute attrs[1] = {};
  attrs[0].id = cudaLaunchAttributeClusterDimension;
  attrs[0].val.clusterDim.x = cute::size<0>(typename Config::ClusterShape{});
  attrs[0].val.clusterDim.y = cute::size<1>(typename Config::ClusterShape{});
  attrs[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = Kernel::get_grid_shape(params);
  config.blockDim = Kernel::get_block_shape();
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attrs;
  config.numAttrs = 1;
  cudaError_t err = cudaLaunchKernelEx(&config, kernel, params);
  return err == cudaSuccess ? cutlass::Status::kSuccess : cutlass::Status::kErrorInternal;
}

}  // namespace sm90

// With `query` set: whether the kernel can run the problem (launches nothing).  Otherwise runs
// it; can_implement()'s failures (kErrorInvalidProblem, kErrorNotSupported) come back untouched
// so that the dispatcher tries the next entry, kErrorInternal is a failed launch.  No workspace.
template <class Config>
cutlass::Status run_sm90_instance(Conv2dBackwardArgs const& a, cudaStream_t stream, bool query) {
  using Kernel = typename Config::Kernel;
  // TMA im2col traversal strides are 1..8 (its descriptor's encode failure is only an assert).
  if (a.stride_h < 1 || a.stride_h > 8 || a.stride_w < 1 || a.stride_w > 8) return cutlass::Status::kErrorNotSupported;
  int slices = 1;
  if constexpr (Config::kWgrad) {
    slices = a.split_k_slices;
    if (slices < 1 || slices > sm90::kMaxWgradSlices || slices > a.N) return cutlass::Status::kErrorNotSupported;
  } else {
    if (a.split_k_slices != 1) return cutlass::Status::kErrorNotSupported;
    if (a.stride_h != 1 || a.stride_w != 1) return cutlass::Status::kErrorNotSupported;  // see the top
  }
  // Every slice is a conv of its own images; the largest slice stands for all in the checks.
  int largest = 0, first = 0;
  sm90::slice_images(a.N, slices, 0, first, largest);
  {
    auto arguments = make_sm90_backward_arguments<Config>(a, largest, a.grad_output, a.input, a.output);
    auto const& problem = arguments.problem_shape;
    // dy's shape must be the caller's (same formula, but the tensor is theirs).
    if (problem.shape_A[1] != a.P || problem.shape_A[2] != a.Q || problem.shape_A[3] != a.K) {
      return cutlass::Status::kErrorInvalidProblem;
    }
    if (!Kernel::can_implement(arguments)) return cutlass::Status::kErrorInvalidProblem;
    if (Kernel::get_workspace_size(arguments) != 0) return cutlass::Status::kErrorNotSupported;
  }
  if (query) return cutlass::Status::kSuccess;
  if (slices == 1) {
    auto arguments = make_sm90_backward_arguments<Config>(a, a.N, a.grad_output, a.input, a.output);
    return sm90::launch<Config>(Kernel::to_underlying_arguments(arguments, nullptr), stream);
  }
  // wgrad over batch slices, concurrently on side streams joined back into `stream`.
  sm90::SideStreams* side = sm90::side_streams();
  if (side == nullptr) return cutlass::Status::kErrorInternal;
  if (cudaEventRecord(side->fork, stream) != cudaSuccess) return cutlass::Status::kErrorInternal;
  int used = std::min(slices, sm90::kSideStreams);
  for (int s = 0; s < used; ++s) {
    if (cudaStreamWaitEvent(side->streams[s], side->fork, 0) != cudaSuccess) return cutlass::Status::kErrorInternal;
  }
  using Element = typename Kernel::ElementA;
  size_t const dy_image = size_t(a.P) * a.Q * a.K, x_image = size_t(a.H) * a.W * a.C;
  size_t const dw_size = size_t(a.K) * a.R * a.S * a.C;
  cutlass::Status status = cutlass::Status::kSuccess;
  for (int i = 0; i < slices && status == cutlass::Status::kSuccess; ++i) {
    int count = 0;
    sm90::slice_images(a.N, slices, i, first, count);
    auto arguments = make_sm90_backward_arguments<Config>(
        a, count, static_cast<Element const*>(a.grad_output) + first * dy_image,
        static_cast<Element const*>(a.input) + first * x_image, static_cast<float*>(a.output) + i * dw_size);
    if (!Kernel::can_implement(arguments)) {
      status = cutlass::Status::kErrorInternal;  // checked above on the largest slice: not expected
      break;
    }
    status = sm90::launch<Config>(Kernel::to_underlying_arguments(arguments, nullptr),
                                  side->streams[i % sm90::kSideStreams]);
  }
  // Join every side stream back, launched or not, so that a capture stays well-formed.
  for (int s = 0; s < used; ++s) {
    if (cudaEventRecord(side->joins[s], side->streams[s]) != cudaSuccess ||
        cudaStreamWaitEvent(stream, side->joins[s], 0) != cudaSuccess) {
      status = cutlass::Status::kErrorInternal;
    }
  }
  return status;
}

}  // namespace conv2d_backward
}  // namespace cutlass_ops
