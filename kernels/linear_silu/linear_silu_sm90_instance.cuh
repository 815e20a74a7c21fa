// Included by every generated linear_silu instance (Hopper, CUTLASS 3.x, sm_90a only): the
// GEMM kernel for one tile configuration, and running it on a LinearSiluArgs.
//
// The kernel: CUTLASS's persistent warp-specialized GEMM (TMA loads, wgmma; cooperative: two
// consumer warp groups on one tile, or ping-pong: two tiles in turn, one's epilogue under the
// other's mainloop) with an epilogue visitor tree (EVT) computing, per output element,
// silu(alpha * (acc + bias[n])) in float32, rounded once to fp16/bf16 and written by TMA; the
// bias is read in the output's dtype (a 16-bit model's own: no cast kernel per call).  No C
// operand.  x is A (row-major, K-major), weight is B (its (n, k) rows are CUTLASS's
// column-major (k, n), K-major too), y is D (row-major).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <type_traits>

#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/kernel_hardware_info.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"
#include "linear_silu/linear_silu_args.h"

namespace cutlass_ops {
namespace linear_silu {

// silu(z) = z / (1 + e^-z) with the fast exponential and division (MUFU; about 2 ulp in float32,
// far below fp16/bf16 rounding): CUTLASS's SiLu divides exactly, a dozen instructions an element
// in an epilogue that the cooperative schedule does not overlap with the mainloop.  Limits: z
// below about -88 gives e^-z = inf and -0 (the true value rounds to 0 in 16 bits), z above
// gives z.
template <class T>
struct FastSilu {
  CUTLASS_HOST_DEVICE T operator()(T const& z) const {
#if defined(__CUDA_ARCH__)
    return __fdividef(z, 1.0f + __expf(-z));
#else
    return z / (1.0f + std::exp(-z));
#endif
  }
};
template <class T, int N>
struct FastSilu<cutlass::Array<T, N>> {
  CUTLASS_HOST_DEVICE cutlass::Array<T, N> operator()(cutlass::Array<T, N> const& z) const {
    cutlass::Array<T, N> y;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) y[i] = FastSilu<T>{}(z[i]);
    return y;
  }
};

// silu(alpha * (acc + bias[n])): the bias a row vector broadcast over the rows (one value per
// output feature), in Element; alpha a scalar.
template <class Element, class TileShape>
using LinearSiluEvt = cutlass::epilogue::fusion::Sm90EVT<
    cutlass::epilogue::fusion::Sm90Compute<FastSilu, Element, float, cutlass::FloatRoundStyle::round_to_nearest>,
    cutlass::epilogue::fusion::Sm90EVT<
        cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, float, float,
                                               cutlass::FloatRoundStyle::round_to_nearest>,
        cutlass::epilogue::fusion::Sm90ScalarBroadcast<float>,  // alpha
        cutlass::epilogue::fusion::Sm90EVT<
            cutlass::epilogue::fusion::Sm90Compute<cutlass::plus, float, float,
                                                   cutlass::FloatRoundStyle::round_to_nearest>,
            cutlass::epilogue::fusion::Sm90AccFetch,  // acc
            cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, Element, float,
                                                        cute::Stride<cute::_0, cute::_1, int64_t>>>>>;  // bias

// Element: cutlass::half_t or cutlass::bfloat16_t; TileM x TileN x TileK: the CTA tile (M over
// rows, N over output features); ClusterM x ClusterN: the cluster (TMA multicast);
// kCooperative: the cooperative schedule, else ping-pong.  Stages: as many as fit beside the
// epilogue's shared memory.
template <class Element, int TileM, int TileN, int TileK, int ClusterM, int ClusterN, bool kCooperative>
struct Sm90LinearSilu {
  static_assert(std::is_same_v<Element, cutlass::half_t> || std::is_same_v<Element, cutlass::bfloat16_t>,
                "linear_silu kernels are fp16 or bf16");
  static constexpr int kAlignment = 8;  // elements: TMA's 16 bytes
  using TileShape = cute::Shape<cute::Int<TileM>, cute::Int<TileN>, cute::Int<TileK>>;
  using ClusterShape = cute::Shape<cute::Int<ClusterM>, cute::Int<ClusterN>, cute::_1>;
  using KernelSchedule = std::conditional_t<kCooperative, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                                            cutlass::gemm::KernelTmaWarpSpecializedPingpong>;
  using EpilogueSchedule = std::conditional_t<kCooperative, cutlass::epilogue::TmaWarpSpecializedCooperative,
                                              cutlass::epilogue::TmaWarpSpecialized>;
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      void, cutlass::layout::RowMajor, kAlignment,      // C: none
      Element, cutlass::layout::RowMajor, kAlignment,   // D: y
      EpilogueSchedule, LinearSiluEvt<Element, TileShape>>::CollectiveOp;
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      Element, cutlass::layout::RowMajor, kAlignment,     // A: x
      Element, cutlass::layout::ColumnMajor, kAlignment,  // B: weight
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<
          static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, CollectiveMainloop,
                                                      CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

template <class Config>
typename Config::Gemm::Arguments make_arguments(LinearSiluArgs const& a) {
  using Kernel = typename Config::Kernel;
  using Element = typename Kernel::ElementA;
  auto stride_a = cutlass::make_cute_packed_stride(typename Kernel::StrideA{}, cute::make_shape(a.m, a.k, 1));
  auto stride_b = cutlass::make_cute_packed_stride(typename Kernel::StrideB{}, cute::make_shape(a.n, a.k, 1));
  auto stride_d = cutlass::make_cute_packed_stride(typename Kernel::StrideD{}, cute::make_shape(a.m, a.n, 1));
  cutlass::KernelHardwareInfo hw;
  hw.device_id = a.device;
  hw.sm_count = a.sm_count;
  typename Config::Gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {a.m, a.n, a.k, 1},
      {static_cast<Element const*>(a.x), stride_a, static_cast<Element const*>(a.weight), stride_b},
      {{}, nullptr, stride_d, static_cast<Element*>(a.y), stride_d},
      hw};
  // the EVT's arguments, children first, then the node's own: silu(alpha * (acc + bias))
  args.epilogue.thread = {
      {                                                           // alpha * (acc + bias)
       {{a.alpha}},                                               //   alpha
       {{}, {static_cast<Element const*>(a.bias), Element(0), {}}, {}},  //   acc + bias (null: zeros)
       {}},
      {}};
  return args;
}

template <class Config>
size_t workspace_bytes(LinearSiluArgs const& a) {
  return Config::Gemm::get_workspace_size(make_arguments<Config>(a));
}

// 0 on success; can_implement()'s refusal as its cutlass::Status; a failed initialize() or
// launch as the negated status (LinearSiluInstance::run).
template <class Config>
int run(LinearSiluArgs const& a, void* workspace, cudaStream_t stream) {
  typename Config::Gemm gemm;
  auto args = make_arguments<Config>(a);
  cutlass::Status status = gemm.can_implement(args);
  if (status != cutlass::Status::kSuccess) return static_cast<int>(status);
  status = gemm.initialize(args, workspace, stream);
  if (status == cutlass::Status::kSuccess) status = gemm.run(stream);
  return -static_cast<int>(status);
}

}  // namespace linear_silu
}  // namespace cutlass_ops
