// Included by the generated persistent family-90 kernel instances (Hopper, sm_90a only;
// tiles.SM90_PERSISTENT_TILES, see README "Hopper (sm90)"): the kernel type for one tile
// configuration.  run_sm90_instance (conv2d_fused_sm90_instance.cuh) launches it like the
// stock kernel: same Conv2dFusedArgs, same can_implement fallthrough, same wait for the
// previous grid (programmatic dependent launch), no split-K, no workspace.
//
// The kernel: CUTLASS 4.2's persistent GEMM kernels (gemm/kernel/sm90_gemm_tma_warpspecialized_
// {cooperative,pingpong}.hpp, one producer and two consumer warp groups, 384 threads, grid =
// min(#tiles, #SMs) with PersistentTileSchedulerSm90) running the stock sm90 conv mainloop
// (TMA im2col loads, wgmma) through conv2d_fused_sm90_persistent.hpp, with the same fused EVT
// epilogue as the stock instances (conv2d_fused_sm90_epilogue.h) on D = [N*P*Q, K] row-major
// (the packed NHWC output; the residual, as source C, likewise).
//   cooperative: both consumer warp groups share one TileM x TileN tile (TileM >= 128), the
//                epilogue schedule TmaWarpSpecializedCooperative;
//   ping-pong:   the two consumer warp groups alternate tiles, one's epilogue under the other's
//                MMA, the epilogue schedule TmaWarpSpecialized.
#pragma once

#include <atomic>

#include <cuda_runtime.h>

#include "conv2d_fused/conv2d_fused_sm90_instance.cuh"
#include "conv2d_fused/conv2d_fused_sm90_persistent.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/kernel_hardware_info.hpp"

namespace cutlass_ops {
namespace conv2d_fused {
namespace sm90 {

// The multiprocessor count of `device`, queried once per device (the persistent grid's size;
// the kernels' to_underlying_arguments would otherwise query it on every call).
inline int multiprocessor_count(int device) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> counts[kMaxDevices] = {};  // 0: not queried yet
  if (device < 0 || device >= kMaxDevices) {
    return cutlass::KernelHardwareInfo::query_device_multiprocessor_count(device);
  }
  int count = counts[device].load(std::memory_order_relaxed);
  if (count <= 0) {
    count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(device);
    if (count > 0) counts[device].store(count, std::memory_order_relaxed);
  }
  return count;
}

}  // namespace sm90

// The persistent kernel for one family-90 configuration.  Parameters as Sm90FusedConv's, with
// the kernel schedule instead of the epilogue schedule:
//   KernelSchedule   sm90_persistent::ConvCooperative or sm90_persistent::ConvPingpong.
template <class Element, int TileM, int TileN, int TileK, int ClusterM, int ClusterN, int Stages,
          class KernelSchedule>
struct Sm90FusedConvPersistent {
  static_assert(cute::is_same_v<Element, cutlass::half_t> || cute::is_same_v<Element, cutlass::bfloat16_t>,
                "family-90 conv2d_fused kernels are fp16 or bf16");
  static constexpr bool kCooperative =
      cute::is_base_of_v<cutlass::gemm::KernelTmaWarpSpecializedCooperative, KernelSchedule>;
  static_assert(kCooperative || cute::is_base_of_v<cutlass::gemm::KernelTmaWarpSpecializedPingpong, KernelSchedule>,
                "KernelSchedule: sm90_persistent::ConvCooperative or ConvPingpong");
  static_assert(!kCooperative || TileM >= 128, "cooperative: the two consumer warp groups split TileM (>= 128)");
  static_assert(Stages == 0 || Stages >= 2, "Stages: 0 (auto) or >= 2");

  static constexpr bool kPersistent = true;
  static constexpr int kAlignment = 128 / cutlass::sizeof_bits<Element>::value;  // 8: TMA's 16 bytes
  static constexpr cutlass::conv::Operator kConvOp = cutlass::conv::Operator::kFprop;
  using ElementAccumulator = float;
  using Layout = cutlass::layout::TensorNHWC;   // activation and filter (KRSC)
  using LayoutD = cutlass::layout::RowMajor;    // output and residual as [N*P*Q, K]
  using TileShape = cute::Shape<cute::Int<TileM>, cute::Int<TileN>, cute::Shape<cute::Int<TileK>>>;
  using ClusterShape = cute::Shape<cute::Int<ClusterM>, cute::Int<ClusterN>, cute::_1>;
  using EpilogueSchedule = cute::conditional_t<kCooperative, cutlass::epilogue::TmaWarpSpecializedCooperative,
                                               cutlass::epilogue::TmaWarpSpecialized>;

  using Evt = cutlass_ops::epilogue::sm90::FusedConvEvt<Element, TileShape>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAccumulator, float,
      Element, LayoutD, kAlignment,   // C: the residual (loaded only when the call has one)
      Element, LayoutD, kAlignment,   // D: the output
      EpilogueSchedule, typename Evt::Callbacks>::CollectiveOp;

  using StageCountType = cute::conditional_t<
      Stages == 0,
      cutlass::conv::collective::StageCountAutoCarveout<int(sizeof(typename CollectiveEpilogue::SharedStorage))>,
      cutlass::conv::collective::StageCount<(Stages == 0 ? 2 : Stages)>>;

  using CollectiveMainloop = typename sm90_persistent::PersistentConvMainloopBuilder<
      kConvOp, Element, Layout, kAlignment, Element, Layout, kAlignment, ElementAccumulator, TileShape,
      ClusterShape, StageCountType, KernelSchedule>::CollectiveOp;

  using ProblemShape = typename CollectiveMainloop::ConvShape;  // ConvProblemShape<kFprop, 2>
  // void: the default persistent tile scheduler (PersistentTileSchedulerSm90; no stream-K).
  using Kernel = cutlass::gemm::kernel::GemmUniversal<typename CollectiveMainloop::ProblemShapeMNKL,
                                                      CollectiveMainloop, CollectiveEpilogue, void>;
  static_assert(cute::is_same_v<typename Kernel::CollectiveMainloop, CollectiveMainloop>,
                "GemmUniversal did not pick the persistent kernel for the conv mainloop");
  static_assert(Kernel::MaxThreadsPerBlock == 384, "persistent kernels: one producer, two consumer warp groups");

  // Not a union of mainloop and epilogue buffers here (the epilogue of one tile runs beside the
  // next tile's loads): both must fit.
  static_assert(Kernel::SharedStorageSize <= 232448,
                "tile x stages needs more shared memory than an sm90 SM has (227 KB): fewer stages");

  static typename Kernel::Arguments make_arguments(Conv2dFusedArgs const& a) {
    using StrideC = typename Kernel::StrideC;
    using StrideD = typename Kernel::StrideD;
    ProblemShape problem(cutlass::conv::Mode::kCrossCorrelation, {a.N, a.H, a.W, a.C}, {a.K, a.R, a.S, a.C},
                         {a.pad_h, a.pad_w}, {a.pad_h, a.pad_w}, {a.stride_h, a.stride_w}, {1, 1}, /*groups*/ 1);
    // The GEMM view: M = N*P*Q, N = K, K = (C,S,R); C and D row-major [M, K] with leading
    // dimension K, which is the packed NHWC output.
    auto mnkl = CollectiveMainloop::gemm_problem_shape(problem);
    int64_t const m = cute::get<0>(mnkl), n = cute::get<1>(mnkl);
    StrideC stride_c{n, cute::Int<1>{}, m * n};
    StrideD stride_d{n, cute::Int<1>{}, m * n};
    auto const* input = static_cast<Element const*>(a.input);
    auto const* weight = static_cast<Element const*>(a.weight);
    auto* output = static_cast<Element*>(a.output);
    // Without a residual the EVT's source node disables the load of C (see make_sm90_arguments).
    auto const* residual = a.residual ? static_cast<Element const*>(a.residual) : output;
    auto fusion = Evt::arguments(a.scale, a.bias, a.bias_scalar, a.residual != nullptr, static_cast<int>(a.act),
                                 a.post_bias);
    cutlass::KernelHardwareInfo hw_info{};
    if (cudaGetDevice(&hw_info.device_id) != cudaSuccess) {
      cudaGetLastError();
      hw_info.device_id = 0;
    }
    hw_info.sm_count = sm90::multiprocessor_count(hw_info.device_id);
    typename Kernel::TileSchedulerArguments scheduler{};  // swizzle 1, raster order heuristic
    return typename Kernel::Arguments{cutlass::gemm::GemmUniversalMode::kGemm,
                                      mnkl,
                                      {problem, {input, weight}},
                                      {fusion, residual, stride_c, output, stride_d},
                                      hw_info,
                                      scheduler};
  }
};

}  // namespace conv2d_fused
}  // namespace cutlass_ops
