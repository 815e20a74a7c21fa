// Included by every generated family-90 kernel instance (Hopper, CUTLASS 3.x, sm_90a only):
// the kernel type for one tile configuration, and launching it on a Conv2dFusedArgs.  The
// counterpart of conv2d_fused_instance.cuh (family 80).
//
// The kernel: cutlass::conv::kernel::ConvUniversal with the sm90 conv CollectiveBuilder's
// mainloop (TMA im2col loads of the activation, TMA loads of the filter, wgmma, one producer
// and one consumer warp group: KernelImplicitTmaWarpSpecializedSm90; CUTLASS 4.2 conv has no
// persistent (cooperative/ping-pong) schedule and no split-K: the persistent instances,
// conv2d_fused_sm90_persistent_instance.cuh, build one) and a TMA warp-specialized
// epilogue running the fused EVT (conv2d_fused_sm90_epilogue.h).  NHWC activation/output,
// KRSC filter, 16-byte aligned channels (alignment 8 for f16/bf16: TMA's requirement).
#pragma once

#include <cuda_runtime.h>

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

#include "common/programmatic_launch.cuh"
#include "conv2d_fused/conv2d_fused_args.h"
#include "conv2d_fused/conv2d_fused_sm90_epilogue.h"

namespace cutlass_ops {
namespace conv2d_fused {

// The CUTLASS kernel for one family-90 configuration.
//   Element                   cutlass::half_t or cutlass::bfloat16_t (activation, filter,
//                             residual, output); fp32 accumulation and epilogue.
//   TileM, TileN, TileK       CTA tile: M over output pixels (N*P*Q), N over output channels
//                             (K), K over the reduction (channels per filter tap).
//   ClusterM, ClusterN        thread block cluster (TMA multicast of B across M, of A across N).
//   Stages                    mainloop pipeline stages: StageCount<Stages>, or 0 for the
//                             builder's automatic count (as many as fit beside the epilogue).
//   EpilogueSchedule          cutlass::epilogue::TmaWarpSpecialized: the only schedule an EVT
//                             runs with on this (non-cooperative) kernel.
template <class Element, int TileM, int TileN, int TileK, int ClusterM, int ClusterN, int Stages,
          class EpilogueSchedule = cutlass::epilogue::TmaWarpSpecialized>
struct Sm90FusedConv {
  static_assert(cute::is_same_v<Element, cutlass::half_t> || cute::is_same_v<Element, cutlass::bfloat16_t>,
                "family-90 conv2d_fused kernels are fp16 or bf16");
  static_assert(cute::is_same_v<EpilogueSchedule, cutlass::epilogue::TmaWarpSpecialized>,
                "the non-persistent 3.x conv kernel has one consumer warp group: the EVT epilogue "
                "needs TmaWarpSpecialized (cooperative assumes two, NoSmem has no EVT)");
  static_assert(Stages == 0 || Stages >= 2, "Stages: 0 (auto) or >= 2");

  // The stock (non-persistent) kernel; Sm90FusedConvPersistent (conv2d_fused_sm90_persistent_instance.cuh)
  // is the persistent one, which run_sm90_instance launches the same way.
  static constexpr bool kPersistent = false;
  static constexpr int kAlignment = 128 / cutlass::sizeof_bits<Element>::value;  // 8: TMA's 16 bytes
  static constexpr cutlass::conv::Operator kConvOp = cutlass::conv::Operator::kFprop;
  using ElementAccumulator = float;
  using Layout = cutlass::layout::TensorNHWC;
  // The K mode is a tuple so that it tiles the channels of one filter tap (C, then S, R):
  // a channel count that is not a multiple of TileK reads zeros past C (TMA's OOB fill).
  using TileShape = cute::Shape<cute::Int<TileM>, cute::Int<TileN>, cute::Shape<cute::Int<TileK>>>;
  using ClusterShape = cute::Shape<cute::Int<ClusterM>, cute::Int<ClusterN>, cute::_1>;

  using Evt = cutlass_ops::epilogue::sm90::FusedConvEvt<Element, TileShape>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAccumulator, float,
      Element, Layout, kAlignment,   // C: the residual (loaded only when the call has one)
      Element, Layout, kAlignment,   // D: the output
      EpilogueSchedule, typename Evt::Callbacks>::CollectiveOp;

  using StageCountType = cute::conditional_t<
      Stages == 0,
      cutlass::conv::collective::StageCountAutoCarveout<int(sizeof(typename CollectiveEpilogue::SharedStorage))>,
      cutlass::conv::collective::StageCount<(Stages == 0 ? 2 : Stages)>>;

  using CollectiveMainloop = typename cutlass::conv::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, kConvOp,
      Element, Layout, kAlignment, Element, Layout, kAlignment, ElementAccumulator,
      TileShape, ClusterShape, StageCountType,
      cutlass::conv::KernelImplicitTmaWarpSpecializedSm90>::CollectiveOp;

  using ProblemShape = cutlass::conv::ConvProblemShape<kConvOp, CollectiveMainloop::NumSpatialDimensions>;
  using Kernel = cutlass::conv::kernel::ConvUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;

  static_assert(Kernel::SharedStorageSize <= 232448,
                "tile x stages needs more shared memory than an sm90 SM has (227 KB): fewer stages");
};

namespace sm90 {

// cutlass::device_kernel with the programmatic-launch wait in front: the epilogue reads the
// scalars (scale, biases) when it is constructed, before the kernel's own griddepcontrol
// wait (which is compiled out unless CUTLASS_ENABLE_GDC_FOR_SM90), so the whole kernel
// waits for the previous grid first, as the family-80 kernels do.
template <class Kernel>
__global__ void __launch_bounds__(Kernel::MaxThreadsPerBlock, Kernel::MinBlocksPerMultiprocessor)
conv2d_fused_sm90_kernel(CUTLASS_GRID_CONSTANT typename Kernel::Params const params) {
  wait_for_previous_grid();
  extern __shared__ char smem[];
  Kernel op;
  op(params, smem);
}

// What the sm90 im2col TMA descriptor accepts beyond CUTLASS's can_implement() (its encode
// failure is only an assert, compiled out in release builds): traversal strides of 1..8.
inline bool tma_im2col_supported(Conv2dFusedArgs const& a) {
  return a.stride_h >= 1 && a.stride_h <= 8 && a.stride_w >= 1 && a.stride_w <= 8;
}

}  // namespace sm90

template <class Config>
typename Config::Kernel::Arguments make_sm90_arguments(Conv2dFusedArgs const& a) {
  using Kernel = typename Config::Kernel;
  using Element = typename Kernel::ElementA;
  using ProblemShape = typename Config::ProblemShape;
  using StrideC = typename Kernel::StrideC;
  using StrideD = typename Kernel::StrideD;

  ProblemShape problem(cutlass::conv::Mode::kCrossCorrelation, {a.N, a.H, a.W, a.C}, {a.K, a.R, a.S, a.C},
                       {a.pad_h, a.pad_w}, {a.pad_h, a.pad_w}, {a.stride_h, a.stride_w}, {1, 1}, /*groups*/ 1);
  // C and D: NHWC over the output, i.e. ((Q,P,N), K) with the pixel strides of shape_C
  // (as CUTLASS's 3.x conv testbed sets them).
  auto output_stride = [&](auto stride) {
    cute::for_each(cute::make_seq<cute::rank<0>(decltype(stride){})>{}, [&](auto i) {
      cute::get<0, i>(stride) = problem.stride_C[ProblemShape::RankT - 2 - i];
    });
    return stride;
  };
  StrideC stride_c = output_stride(StrideC{});
  StrideD stride_d = output_stride(StrideD{});
  auto const* input = static_cast<Element const*>(a.input);
  auto const* weight = static_cast<Element const*>(a.weight);
  auto* output = static_cast<Element*>(a.output);
  // Without a residual the EVT's source node disables the load of C: its TMA descriptor is
  // built on the output (a valid address) and never used.
  auto const* residual = a.residual ? static_cast<Element const*>(a.residual) : output;
  auto fusion = Config::Evt::arguments(a.scale, a.bias, a.bias_scalar, a.residual != nullptr, static_cast<int>(a.act),
                                       a.post_bias);
  return typename Kernel::Arguments(problem, {input, weight}, {fusion, residual, stride_c, output, stride_d});
}

// Runs the kernel; returns can_implement()'s failure (kErrorInvalidProblem,
// kErrorNotSupported) untouched so that the dispatcher tries the next entry, and
// kErrorInternal for a failed launch.  No workspace (no split-K).
// The same for the persistent kernels (Config::kPersistent: their arguments come from
// Config::make_arguments and carry the conv shape in the mainloop's arguments; a kernel that
// would need a workspace, which none of ours does, is refused rather than launched without).
template <class Config>
cutlass::Status run_sm90_instance(Conv2dFusedArgs const& a, cudaStream_t stream) {
  using Kernel = typename Config::Kernel;
  if (a.split_k_slices != 1) return cutlass::Status::kErrorNotSupported;
  if (!sm90::tma_im2col_supported(a)) return cutlass::Status::kErrorNotSupported;
  auto arguments = [&] {
    if constexpr (Config::kPersistent) {
      return Config::make_arguments(a);
    } else {
      return make_sm90_arguments<Config>(a);
    }
  }();
  auto const& conv_problem = [&]() -> typename Config::ProblemShape const& {
    if constexpr (Config::kPersistent) {
      return arguments.mainloop.problem_shape;
    } else {
      return arguments.problem_shape;
    }
  }();
  // The problem's output size must be the caller's (same formula, but the output is theirs).
  if (conv_problem.shape_C[1] != a.P || conv_problem.shape_C[2] != a.Q) {
    return cutlass::Status::kErrorInvalidProblem;
  }
  if (!Kernel::can_implement(arguments)) return cutlass::Status::kErrorInvalidProblem;
  if constexpr (Config::kPersistent) {
    if (Kernel::get_workspace_size(arguments) != 0) return cutlass::Status::kErrorNotSupported;
  }
  typename Kernel::Params params = Kernel::to_underlying_arguments(arguments, /*workspace*/ nullptr);

  auto kernel = sm90::conv2d_fused_sm90_kernel<Kernel>;
  int smem = Kernel::SharedStorageSize;
  if (smem >= (48 << 10) &&
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess) {
    return cutlass::Status::kErrorInternal;
  }
  cudaLaunchAttribute attrs[2] = {};
  attrs[0].id = cudaLaunchAttributeClusterDimension;
  attrs[0].val.clusterDim.x = cute::size<0>(typename Config::ClusterShape{});
  attrs[0].val.clusterDim.y = cute::size<1>(typename Config::ClusterShape{});
  attrs[0].val.clusterDim.z = 1;
  attrs[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[1].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = Kernel::get_grid_shape(params);
  config.blockDim = Kernel::get_block_shape();
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attrs;
  config.numAttrs = (a.programmatic_launch && kernel_waits_for_previous_grid<sm90::conv2d_fused_sm90_kernel<Kernel>>()) ? 2 : 1;
  cudaError_t err = cudaLaunchKernelEx(&config, kernel, params);
  return err == cudaSuccess ? cutlass::Status::kSuccess : cutlass::Status::kErrorInternal;
}

}  // namespace conv2d_fused
}  // namespace cutlass_ops
