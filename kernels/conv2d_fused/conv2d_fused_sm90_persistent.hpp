// Persistent (cooperative / ping-pong) sm90 implicit-GEMM conv fprop from CUTLASS 4.2's own pieces.
// Used by the library's persistent family-90 conv2d_fused instances
// (conv2d_fused_sm90_persistent_instance.cuh) and by docs/experiments/sm90_conv3x_fprop (where it
// was written and measured; its sm90_conv_persistent.hpp includes this file).  Do not include
// cutlass/gemm/device/gemm_universal_adapter.h next to the stock ConvUniversal: it brings in the
// CUTLASS 2.x GemmUniversal, whose partial specialization then makes ConvUniversal ambiguous.
//
// CUTLASS 4.2 (and upstream up to v4.7) ships only the non-persistent sm90 conv kernel:
//  - cutlass/conv/dispatch_policy.hpp:81 static_asserts "Persistent schedules not support for conv yet." when
//    MainloopSm90TmaGmmaWarpSpecializedImplicitGemm gets KernelImplicitTmaWarpSpecializedSm90{Cooperative,Pingpong};
//    those two tags do not even derive from the GEMM schedules, so no GEMM kernel would match them.
//  - cutlass/conv/kernel/sm90_implicit_gemm_tma_warpspecialized.hpp specializes ConvUniversal only for
//    KernelImplicitTmaWarpSpecializedSm90 (-> gemm/kernel/sm90_gemm_tma_warpspecialized.hpp, which NVIDIA taught
//    about ConvProblemShape: IsConvProblemShape, get_problem_shape_MNKL_helper, rank-4 load_init tensors).
//  - The persistent GEMM kernels (gemm/kernel/sm90_gemm_tma_warpspecialized_{cooperative,pingpong}.hpp) were not
//    taught that: they static_assert a rank-3/4 tuple ProblemShape (cooperative.hpp:72, pingpong.hpp:76), rank-3
//    StrideA/B/C/D (cooperative.hpp:360-363, pingpong.hpp:368-371), read CollectiveMainloop::NumProducerThreadEvents
//    (cooperative.hpp:128, pingpong.hpp:133; the conv collective has none), take shape<4>(gB_nkl) for the L
//    coordinate (cooperative.hpp:601, pingpong.hpp:632; the conv load_init returns rank-4 tensors without L),
//    and hand args.problem_shape to
//    CollectiveMainloop::to_underlying_arguments (the conv collective needs the ConvProblemShape there).
//
// What this header does instead (no CUTLASS file is modified or copied):
//  1. Schedule tags ConvCooperative / ConvPingpong deriving from gemm::KernelTmaWarpSpecialized{Cooperative,
//     Pingpong}. They are not the two tags that dispatch_policy.hpp:81 refuses, so
//     MainloopSm90TmaGmmaWarpSpecializedImplicitGemm accepts them, and GemmUniversal's enable_if
//     (is_base_of<KernelTmaWarpSpecializedCooperative, Schedule>) picks the persistent cooperative / ping-pong
//     kernel for the resulting collective.
//  2. The conv mainloop (CollectiveConv, unchanged: TMA im2col for A, tiled TMA for B, the same wgmma mma()) is
//     built from the conv CollectiveBuilder's own outputs (TMA atoms, smem layouts, stage count) with the TiledMma
//     re-made with AtomLayout 2x1x1 for cooperative (the builder's line 134 does the same for its refused
//     Cooperative tag) and 1x1x1 for ping-pong.
//  3. ConvAsGemmMainloop<CollectiveConv> wraps that collective in the GEMM kernels' interface:
//     - ProblemShape of the kernel = the collective's own linearized MNKL: (N*P*Q, K, (C,S,R), 1). The
//       tile scheduler's k-tile count is size(ceil_div((C,S,R), (TK))) = C/TK*S*R, and the kernels' k_tile_iter
//       walks that hierarchical K exactly as the non-persistent conv kernel does.
//     - Arguments carry the ConvProblemShape next to the conv mainloop arguments, so to_underlying_arguments /
//       can_implement hand the ConvProblemShape to the conv collective and ignore the MNKL shape.
//     - load_init returns (gA5, gB5, gA, gB): gA5/gB5 are shape-only tensors, the conv tensors' shapes with a
//       trailing L mode of extent 1 (the kernel only reads shape<2>, shape<3>, shape<4> of them); load()
//       forwards (gA, gB) to the conv collective's load().
//     - NumProducerThreadEvents = 1 (one elected TMA thread, as in the GEMM TMA mainloop) and rank-3 dummy
//       StrideA/StrideB (only the kernels' static_asserts read them; the conv collective uses its own).
//  4. The epilogue is an ordinary GEMM epilogue on D = [N*P*Q, K] row-major (NHWC output, packed), with the
//     cooperative or the plain TMA epilogue schedule.
#pragma once

#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/conv/convnd_problem_shape.hpp"
#include "cutlass/conv/dispatch_policy.hpp"
#include "cutlass/conv/collective/collective_builder.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"

namespace cutlass_ops {
namespace sm90_persistent {

struct ConvCooperative : cutlass::gemm::KernelTmaWarpSpecializedCooperative {};
struct ConvPingpong : cutlass::gemm::KernelTmaWarpSpecializedPingpong {};

template <class ConvMainloop>
struct ConvAsGemmMainloop : ConvMainloop {
  using Base = ConvMainloop;
  using ConvShape = typename Base::ProblemShape;  // ConvProblemShape<Op, SpatialDims>
  // The kernel's problem shape: the collective's linearized (N*P*Q, K, (C,S,R), _1) with L as a run-time int,
  // as in GEMM (the TMA epilogue's Params type is built for an int L: a static _1 there gives a different
  // TMA_D type, sm90_epilogue_tma_warpspecialized.hpp:294).
  using ShapeK = cute::remove_cvref_t<decltype(cute::get<2>(Base::get_problem_shape_MNKL(ConvShape{})))>;  // (C,S,R)
  using ProblemShapeMNKL = cute::Shape<int, int, ShapeK, int>;
  static ProblemShapeMNKL gemm_problem_shape(ConvShape const& conv_shape) {
    auto m = Base::get_problem_shape_MNKL(conv_shape);
    return ProblemShapeMNKL{int(cute::get<0>(m)), int(cute::get<1>(m)), cute::get<2>(m), 1};
  }

  // Read only by the persistent kernels' static_asserts (rank 3); the collective uses Base::StrideA/B.
  using StrideA = cute::Stride<int64_t, cute::_1, int64_t>;
  using StrideB = cute::Stride<int64_t, cute::_1, int64_t>;
  // One elected thread issues the TMA loads and arrives on the full barrier (= the GEMM TMA mainloop's value).
  static constexpr uint32_t NumProducerThreadEvents = 1;

  using typename Base::MainloopPipeline;
  using typename Base::PipelineState;
  using typename Base::TensorStorage;
  using Params = typename Base::Params;

  struct Arguments {
    ConvShape problem_shape{};
    typename Base::Arguments conv{};
  };

  static constexpr Params to_underlying_arguments(ProblemShapeMNKL const&, Arguments const& args, void* workspace) {
    return Base::to_underlying_arguments(args.problem_shape, args.conv, workspace);
  }

  static bool can_implement(ProblemShapeMNKL const& mnkl, Arguments const& args) {
    // The kernel's MNKL shape must be the one the conv shape linearizes to (the tile scheduler uses it).
    auto ref = gemm_problem_shape(args.problem_shape);
    bool same = cute::get<0>(ref) == cute::get<0>(mnkl) && cute::get<1>(ref) == cute::get<1>(mnkl) &&
                cute::get<2>(ref) == cute::get<2>(mnkl) && cute::get<3>(mnkl) == 1;
    return same && Base::can_implement(args.problem_shape, args.conv);
  }

  template <class ProblemShape_MNKL>
  CUTLASS_DEVICE auto load_init(ProblemShape_MNKL const& problem_shape_MNKL, Params const& params) {
    auto inputs = Base::load_init(problem_shape_MNKL, params);
    auto gA = cute::get<0>(inputs);  // (BLK_M,BLK_K,m,k)
    auto gB = cute::get<1>(inputs);  // (BLK_N,BLK_K,n,k)
    // Shape-only stand-ins (BLK_M,BLK_K,m,k,l=1) / (BLK_N,BLK_K,n,k,l=1): the kernel reads shape<2>, shape<3> and
    // shape<4> (for the L coordinate) of get<0>/get<1> and never indexes them; the im2col TMA tensor's
    // ComposedLayout cannot simply be extended by a mode.
    auto gA5 = cute::make_tensor(cute::make_gmem_ptr(static_cast<char const*>(nullptr)),
                                 cute::make_layout(cute::append(cute::shape(gA), cute::Int<1>{})));
    auto gB5 = cute::make_tensor(cute::make_gmem_ptr(static_cast<char const*>(nullptr)),
                                 cute::make_layout(cute::append(cute::shape(gB), cute::Int<1>{})));
    return cute::make_tuple(gA5, gB5, gA, gB);
  }

  template <class LoadInputs, class BlockCoord, class KTileIterator>
  CUTLASS_DEVICE void load(Params const& params, MainloopPipeline pipeline, PipelineState smem_pipe_producer_state,
                           LoadInputs const& load_inputs, BlockCoord const& blk_coord, KTileIterator k_tile_iter,
                           int k_tile_count, int thread_idx, uint32_t block_rank_in_cluster,
                           TensorStorage& shared_tensors) {
    Base::load(params, pipeline, smem_pipe_producer_state,
               cute::make_tuple(cute::get<2>(load_inputs), cute::get<3>(load_inputs)), blk_coord, k_tile_iter,
               k_tile_count, thread_idx, block_rank_in_cluster, shared_tensors);
  }
};

// The conv mainloop for a persistent schedule, made from the conv CollectiveBuilder's outputs for the
// non-persistent schedule (same TMA atoms, smem layouts and stage count); only the TiledMma (2 consumer
// warp groups along M for cooperative) and the schedule tag differ.
template <cutlass::conv::Operator ConvOp, class ElementA, class LayoutA, int AlignA, class ElementB, class LayoutB,
          int AlignB, class ElementAcc, class TileShape, class ClusterShape, class StageCountType, class Schedule>
struct PersistentConvMainloopBuilder {
  using Ref = typename cutlass::conv::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ConvOp, ElementA, LayoutA, AlignA, ElementB, LayoutB,
      AlignB, ElementAcc, TileShape, ClusterShape, StageCountType,
      cutlass::conv::KernelImplicitTmaWarpSpecializedSm90>::CollectiveOp;
  static_assert(ConvOp == cutlass::conv::Operator::kFprop, "only fprop is wired up here");
  static constexpr bool Coop = cute::is_base_of_v<cutlass::gemm::KernelTmaWarpSpecializedCooperative, Schedule>;
  using AtomLayout = cute::conditional_t<Coop, cute::Layout<cute::Shape<cute::_2, cute::_1, cute::_1>>,
                                         cute::Layout<cute::Shape<cute::_1, cute::_1, cute::_1>>>;
  using TiledMma = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<ElementA, ElementB, ElementAcc, TileShape, cute::GMMA::Major::K,
                                 cute::GMMA::Major::K>(),
      AtomLayout{}));
  using RefPolicy = typename Ref::DispatchPolicy;
  using DispatchPolicy = cutlass::conv::MainloopSm90TmaGmmaWarpSpecializedImplicitGemm<
      ConvOp, RefPolicy::Stages, RefPolicy::NumSpatialDimensions, ClusterShape, Schedule>;
  using Collective = cutlass::conv::collective::CollectiveConv<
      DispatchPolicy, TileShape, ElementA, ElementB, TiledMma,
      cutlass::conv::collective::detail::Sm90ImplicitGemmTileTraits<typename Ref::GmemTiledCopyA,
                                                                     typename Ref::SmemLayoutA>,
      cutlass::conv::collective::detail::Sm90ImplicitGemmTileTraits<typename Ref::GmemTiledCopyB,
                                                                     typename Ref::SmemLayoutB>>;
  using CollectiveOp = ConvAsGemmMainloop<Collective>;
};

}  // namespace sm90_persistent
}  // namespace cutlass_ops
