// One CUTLASS 3.x sm90 (TMA im2col + wgmma, warp-specialized) conv fprop configuration, chosen by macros;
// run_sweep.sh compiles this file once per variant (in parallel) and links all of them with sweep_main.cu.
//
//   VID       short id (a C identifier; also names this TU's namespace)
//   TM TN TK  CTA tile (TK = 64 for fp16: 4 x k16 wgmma)
//   CM CN     cluster shape (M, N)
//   STAGES    0 = StageCountAutoCarveout (what CUTLASS's tests and generator.py use),
//             else cutlass::conv::collective::StageCount<STAGES>
//   EPI     0 = EpilogueScheduleAuto (the sm90 epilogue builder turns Auto into NoSmemWarpSpecialized:
//               epilogue/collective/builders/sm90_builder.inl, "Auto builder"), 1 = TmaWarpSpecialized
//   EPI_N   TMA epilogue subtile N (0 = EpilogueTileAuto: 64 x min(32, TN) for this schedule)
//   CVOID   1 = ElementC void (no source tensor, no C smem, TMA store delayed); 0 = C = D with beta 0
//   MINB    __launch_bounds__ min blocks/SM for the kernel (CUTLASS's sm90 kernel says 1); m asks ptxas
//           to fit m CTAs of 256 threads per SM, i.e. <= 65536 / (256 m) registers/thread
//   SCHED   0 = CUTLASS 4.2's sm90 ConvUniversal (non-persistent, one consumer warp group, 256 threads);
//           1 = persistent cooperative (two consumer warp groups share one TMxTN tile, 384 threads, TM >= 128),
//           2 = persistent ping-pong (two consumer warp groups alternate tiles, 384 threads);
//           1 and 2 plug the conv mainloop into CUTLASS's GEMM kernels, see sm90_conv_persistent.hpp.
//           They need EPI=1 (TMA epilogue; cooperative gets TmaWarpSpecializedCooperative).
//   SWZ     persistent only: tile scheduler max_swizzle_size (1, 2, 4, 8; default 1)
#include <cstdio>
#include <memory>

#ifndef SCHED
#define SCHED 0
#endif

#include "cutlass/cutlass.h"
#include "cutlass/kernel_hardware_info.hpp"
#include "cute/tensor.hpp"
#include "cutlass/conv/convolution.h"
#include "cutlass/conv/convnd_problem_shape.hpp"
#include "cutlass/conv/dispatch_policy.hpp"
#include "cutlass/conv/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/conv/device/conv_universal_adapter.hpp"
#include "cutlass/conv/kernel/conv_universal.hpp"
#include "cutlass/device_kernel.h"
#include "cutlass/util/device_memory.h"
#if SCHED != 0
// Only for the persistent variants: this header brings in the CUTLASS 2.x GemmUniversal
// (gemm/kernel/gemm_universal.h), whose partial specialization also matches GemmUniversal<ConvProblemShape, ...>
// and makes the stock ConvUniversal (SCHED=0) ambiguous.
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "sm90_conv_persistent.hpp"
#endif

#include "sweep_common.h"

#ifndef VID
#error "define VID (a C identifier naming the variant)"
#endif
#define SWEEP_STR2(x) #x
#define SWEEP_STR(x) SWEEP_STR2(x)
#define SWEEP_CAT2(a, b) a##b
#define SWEEP_CAT(a, b) SWEEP_CAT2(a, b)
#define VNAME SWEEP_STR(VID)
#ifndef TM
#define TM 128
#endif
#ifndef TN
#define TN 64
#endif
#ifndef TK
#define TK 64
#endif
#ifndef CM
#define CM 1
#endif
#ifndef CN
#define CN 1
#endif
#ifndef STAGES
#define STAGES 0
#endif
#ifndef EPI
#define EPI 0
#endif
#ifndef EPI_N
#define EPI_N 0
#endif
#ifndef CVOID
#define CVOID 0
#endif
#ifndef MINB
#define MINB 1
#endif
#ifndef SWZ
#define SWZ 1
#endif
#if SCHED != 0 && EPI != 1
#error "SCHED 1/2 (persistent) need EPI=1 (TMA warp-specialized epilogue)"
#endif

// A namespace unique to this variant: kernels of different TUs must not share a mangled name.
namespace SWEEP_CAT(sweep_variant_, VID) {
using namespace cute;

using Elt = cutlass::half_t;
using Lay = cutlass::layout::TensorNHWC;
using TileShape = Shape<Int<TM>, Int<TN>, Shape<Int<TK>>>;
using ClusterShape = Shape<Int<CM>, Int<CN>, _1>;
constexpr auto Op = cutlass::conv::Operator::kFprop;
using ElementC = cute::conditional_t<CVOID != 0, void, Elt>;

#if EPI == 0
using EpiSchedule = cutlass::epilogue::collective::EpilogueScheduleAuto;
#elif SCHED == 1
using EpiSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
#else
using EpiSchedule = cutlass::epilogue::TmaWarpSpecialized;
#endif
#if SCHED == 0
using LayD = Lay;  // the conv kernel's epilogue sees D as NHWC with a hierarchical M = (Q,P,N)
#else
using LayD = cutlass::layout::RowMajor;  // GEMM kernel: D = [N*P*Q, K] row-major (packed NHWC)
#endif
#if EPI_N == 0
using EpiTile = cutlass::epilogue::collective::EpilogueTileAuto;
#else
using EpiTile = Shape<_64, Int<EPI_N>>;
#endif

using Epi = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape, EpiTile, float, float,
    ElementC, LayD, 8, Elt, LayD, 8, EpiSchedule>::CollectiveOp;

#if STAGES == 0
using StageCountType = cutlass::conv::collective::StageCountAutoCarveout<int(sizeof(typename Epi::SharedStorage))>;
#else
using StageCountType = cutlass::conv::collective::StageCount<STAGES>;
#endif

using PS = cutlass::conv::ConvProblemShape<Op, 2>;
#if SCHED == 0
using Main = typename cutlass::conv::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Op, Elt, Lay, 8, Elt, Lay, 8, float, TileShape, ClusterShape,
    StageCountType, cutlass::conv::collective::KernelScheduleAuto>::CollectiveOp;
using BaseKernel = cutlass::conv::kernel::ConvUniversal<PS, Main, Epi>;
#else
using KSchedule = cute::conditional_t<SCHED == 1, sweep_persistent::ConvCooperative, sweep_persistent::ConvPingpong>;
using Main = typename sweep_persistent::PersistentConvMainloopBuilder<
    Op, Elt, Lay, 8, Elt, Lay, 8, float, TileShape, ClusterShape, StageCountType, KSchedule>::CollectiveOp;
// void = the default persistent tile scheduler (PersistentTileSchedulerSm90)
using BaseKernel = cutlass::gemm::kernel::GemmUniversal<typename Main::ProblemShapeMNKL, Main, Epi, void>;
static_assert(cute::is_same_v<typename BaseKernel::CollectiveMainloop, Main>);
#endif

// Same kernel; only the min-blocks-per-SM launch bound differs (cutlass/device_kernel.h reads
// Operator::MinBlocksPerMultiprocessor). The adapter only uses the kernel's public interface.
struct Kernel : BaseKernel {
  static constexpr uint32_t MinBlocksPerMultiprocessor = MINB;
};
#if SCHED == 0
using Conv = cutlass::conv::device::ConvUniversalAdapter<Kernel>;
#else
using Conv = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
#endif

static_assert(sizeof(Kernel) == sizeof(BaseKernel));

sweep::VariantInfo info() {
  sweep::VariantInfo v{};
  v.name = VNAME;
  char buf[256];
  char epin[16] = "", minb[16] = "", sched[48] = "";
  if (EPI_N != 0) snprintf(epin, sizeof epin, " sub64x%d", EPI_N);
  if (MINB > 1) snprintf(minb, sizeof minb, " minBlocks%d", MINB);
  if (SCHED != 0) snprintf(sched, sizeof sched, "persistent %s%s ", SCHED == 1 ? "coop" : "pingpong", SWZ > 1 ? " swz" SWEEP_STR(SWZ) : "");
  snprintf(buf, sizeof buf, "%stile %dx%dx%d cluster %dx%d stages %s%d epi %s%s%s%s%s", sched, TM, TN, TK, CM, CN,
           STAGES == 0 ? "auto=" : "", int(Main::DispatchPolicy::Stages),
           EPI == 0 ? "auto(NoSmem)" : (SCHED == 1 ? "TMA-WS-coop" : "TMA-WS"), epin,
           CVOID ? " C=void" : "", minb,
#ifdef NDEBUG
           ""
#else
           " asserts"
#endif
  );
  v.desc = buf;
  v.tm = TM; v.tn = TN; v.tk = TK; v.cm = CM; v.cn = CN;
  v.stages = Main::DispatchPolicy::Stages;
  v.smem_bytes = int(Kernel::SharedStorageSize);
  v.threads = int(Kernel::MaxThreadsPerBlock);
  v.min_blocks = MINB;
  cudaFuncAttributes fa{};
  if (cudaFuncGetAttributes(&fa, cutlass::device_kernel<Kernel>) == cudaSuccess) {
    v.regs = fa.numRegs;
    v.local_bytes = int(fa.localSizeBytes);
  } else {
    v.regs = v.local_bytes = -1;
  }
  cudaFuncSetAttribute(cutlass::device_kernel<Kernel>, cudaFuncAttributeMaxDynamicSharedMemorySize, v.smem_bytes);
  int occ = -1;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, cutlass::device_kernel<Kernel>, v.threads, v.smem_bytes) !=
      cudaSuccess)
    occ = -1;
  v.ctas_per_sm = occ;
  cudaGetLastError();
  return v;
}

struct RunnerImpl : sweep::Runner {
  Conv conv;
  typename Conv::Arguments args;
  cutlass::DeviceAllocation<uint8_t> ws;
  long long ctas = 0;

  bool init(sweep::Problem const& p, half const* x, half const* w, half* y, std::string& why) override {
    PS shape(cutlass::conv::Mode::kCrossCorrelation, {p.n, p.h, p.w, p.c}, {p.k, p.r, p.r, p.c}, {p.pad, p.pad},
             {p.pad, p.pad}, {p.stride, p.stride}, {1, 1}, 1);
    auto const* xa = reinterpret_cast<Elt const*>(x);
    auto const* wa = reinterpret_cast<Elt const*>(w);
    auto* ya = reinterpret_cast<Elt*>(y);
#if SCHED == 0
    typename Kernel::StrideD sd;
    cute::for_each(cute::make_seq<cute::rank<0>(typename Kernel::StrideD{})>{},
                   [&](auto i) { cute::get<0, i>(sd) = shape.stride_C[PS::RankT - 2 - i]; });
    typename Kernel::StrideC sc;
    cute::for_each(cute::make_seq<cute::rank<0>(typename Kernel::StrideC{})>{},
                   [&](auto i) { cute::get<0, i>(sc) = shape.stride_C[PS::RankT - 2 - i]; });
#if CVOID
    args = typename Conv::Arguments{shape, {xa, wa}, {{1.f, 0.f}, nullptr, sc, ya, sd}};
#else
    args = typename Conv::Arguments{shape, {xa, wa}, {{1.f, 0.f}, ya, sc, ya, sd}};
#endif
#else
    // GEMM view: M = N*P*Q, N = K, K = (C,S,R); D row-major [M, K] with leading dimension K (packed NHWC).
    auto mnkl = Main::gemm_problem_shape(shape);
    int64_t gm = cute::get<0>(mnkl), gn = cute::get<1>(mnkl);
    typename Kernel::StrideD sd{gn, cute::Int<1>{}, gm * gn};
    typename Kernel::StrideC sc{gn, cute::Int<1>{}, gm * gn};
    cutlass::KernelHardwareInfo hw;
    cudaGetDevice(&hw.device_id);
    hw.sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(hw.device_id);
    typename Kernel::TileSchedulerArguments sched{};
    sched.max_swizzle_size = SWZ;
#if CVOID
    args = typename Conv::Arguments{cutlass::gemm::GemmUniversalMode::kGemm, mnkl, {shape, {xa, wa}},
                                    {{1.f, 0.f}, nullptr, sc, ya, sd}, hw, sched};
#else
    args = typename Conv::Arguments{cutlass::gemm::GemmUniversalMode::kGemm, mnkl, {shape, {xa, wa}},
                                    {{1.f, 0.f}, ya, sc, ya, sd}, hw, sched};
#endif
#endif
    cutlass::Status st = conv.can_implement(args);
    if (st != cutlass::Status::kSuccess) {
      why = std::string("can_implement: ") + cutlassGetStatusString(st);
      return false;
    }
    ws.reset(Conv::get_workspace_size(args) + 1);
    st = conv.initialize(args, ws.get());
    if (st != cutlass::Status::kSuccess) {
      why = std::string("initialize: ") + cutlassGetStatusString(st);
      return false;
    }
    dim3 g = Conv::get_grid_shape(args, ws.get());
    ctas = (long long)g.x * g.y * g.z;
    return true;
  }
  long long grid_ctas() const override { return ctas; }
  cudaError_t run(cudaStream_t stream, int launches) override {
    for (int i = 0; i < launches; ++i) {
      cutlass::Status st = conv.run(stream);
      if (st != cutlass::Status::kSuccess) return cudaErrorLaunchFailure;
    }
    return cudaGetLastError();
  }
};

sweep::Runner* make_runner() { return new RunnerImpl(); }

sweep::Registrar reg({VNAME, &info, &make_runner});

}  // namespace sweep_variant_<VID>
