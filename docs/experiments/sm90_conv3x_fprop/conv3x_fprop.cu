// CUTLASS 3.x sm90 (TMA + wgmma) conv fprop timings on FusedResNet's forward shapes (an experiment:
// docs/experiments/sm90_conv3x_fprop/run.sh builds one binary per tile; -DTM/TN/TK tile, -DCM cluster M).
#include <cstdio>
#include <vector>
#include "cutlass/cutlass.h"
#include "cutlass/kernel_hardware_info.hpp"
#include <algorithm>
#include "cute/tensor.hpp"
#include "cutlass/conv/convolution.h"
#include "cutlass/conv/convnd_problem_shape.hpp"
#include "cutlass/conv/dispatch_policy.hpp"
#include "cutlass/conv/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/conv/device/conv_universal_adapter.hpp"
#include "cutlass/conv/kernel/conv_universal.hpp"
#include "cutlass/util/device_memory.h"

using namespace cute;
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

using Elt = cutlass::half_t;
using Lay = cutlass::layout::TensorNHWC;
using TileShape = Shape<Int<TM>, Int<TN>, Shape<Int<TK>>>;
using ClusterShape = Shape<Int<CM>, _1, _1>;
constexpr auto Op = cutlass::conv::Operator::kFprop;

using Epi = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float,
    Elt, Lay, 8, Elt, Lay, 8, cutlass::epilogue::collective::EpilogueScheduleAuto>::CollectiveOp;
using Main = typename cutlass::conv::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Op, Elt, Lay, 8, Elt, Lay, 8, float, TileShape, ClusterShape,
    cutlass::conv::collective::StageCountAutoCarveout<int(sizeof(typename Epi::SharedStorage))>,
    cutlass::conv::collective::KernelScheduleAuto>::CollectiveOp;
using PS = cutlass::conv::ConvProblemShape<Op, 2>;
using Kernel = cutlass::conv::kernel::ConvUniversal<PS, Main, Epi>;
using Conv = cutlass::conv::device::ConvUniversalAdapter<Kernel>;

struct P { int n, h, w, c, k, r, stride, pad; };

int main() {
  std::vector<P> ps;
  for (int n : {512, 2048}) {
    ps.push_back({n, 16, 16, 64, 64, 3, 1, 1});
    ps.push_back({n, 16, 16, 64, 128, 3, 2, 1});
    ps.push_back({n, 8, 8, 128, 128, 3, 1, 1});
    ps.push_back({n, 8, 8, 128, 256, 3, 2, 1});
    ps.push_back({n, 4, 4, 256, 256, 3, 1, 1});
    ps.push_back({n, 4, 4, 256, 512, 3, 2, 1});
    ps.push_back({n, 2, 2, 512, 512, 3, 1, 1});
    ps.push_back({n, 8, 8, 64, 128, 1, 1, 0});
  }
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (P const& p : ps) {
    int const P_ = (p.h + 2 * p.pad - p.r) / p.stride + 1, Q_ = (p.w + 2 * p.pad - p.r) / p.stride + 1;
    PS shape(cutlass::conv::Mode::kCrossCorrelation, {p.n, p.h, p.w, p.c}, {p.k, p.r, p.r, p.c},
             {p.pad, p.pad}, {p.pad, p.pad}, {p.stride, p.stride}, {1, 1}, 1);
    cutlass::DeviceAllocation<Elt> A(size_t(p.n) * p.h * p.w * p.c), B(size_t(p.k) * p.r * p.r * p.c),
        D(size_t(p.n) * P_ * Q_ * p.k);
    cudaMemset(A.get(), 0x11, A.bytes());
    cudaMemset(B.get(), 0x11, B.bytes());
    typename Kernel::StrideD sd;
    cute::for_each(cute::make_seq<cute::rank<0>(typename Kernel::StrideD{})>{},
                   [&](auto i) { cute::get<0, i>(sd) = shape.stride_C[PS::RankT - 2 - i]; });
    typename Conv::Arguments args{shape, {A.get(), B.get()}, {{1.f, 0.f}, D.get(), sd, D.get(), sd}};
    Conv conv;
    if (conv.can_implement(args) != cutlass::Status::kSuccess) {
      printf("TILE %dx%dx%d c%d: n%d h%d c%d k%d r%d s%d: cannot implement\n", TM, TN, TK, CM, p.n, p.h, p.c, p.k, p.r, p.stride);
      continue;
    }
    cutlass::DeviceAllocation<uint8_t> ws(Conv::get_workspace_size(args) + 1);
    conv.initialize(args, ws.get());
    for (int i = 0; i < 5; ++i) conv.run();
    std::vector<float> t;
    for (int rep = 0; rep < 7; ++rep) {
      cudaEventRecord(e0);
      for (int i = 0; i < 20; ++i) conv.run();
      cudaEventRecord(e1);
      cudaEventSynchronize(e1);
      float ms;
      cudaEventElapsedTime(&ms, e0, e1);
      t.push_back(ms * 1000.f / 20);
    }
    std::sort(t.begin(), t.end());
    cudaError_t err = cudaGetLastError();
    printf("TILE %dx%dx%d c%d: n%d h%d c%d k%d r%d s%d: %.1f us %s\n", TM, TN, TK, CM, p.n, p.h, p.c, p.k, p.r,
           p.stride, t[3], cudaGetErrorString(err));
  }
}
