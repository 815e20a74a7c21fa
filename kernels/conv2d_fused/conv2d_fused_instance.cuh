// Included by every generated kernel instance: launches one CUTLASS kernel type on a
// Conv2dFusedArgs.  Kept small: each instance compiles it once (about 7 s per arch).
#pragma once

#include <cuda_runtime.h>

#include "cutlass/conv/conv2d_problem_size.h"
#include "cutlass/conv/device/implicit_gemm_convolution.h"
#include "cutlass/conv/kernel/default_conv2d_fprop_with_broadcast.h"
#include "cutlass/cutlass.h"
#include "cutlass/numeric_types.h"

#include "common/programmatic_launch.cuh"
#include "conv2d_fused/conv2d_fused_args.h"
#include "conv2d_fused/conv2d_fused_epilogue.h"

namespace cutlass_ops {
namespace conv2d_fused {

template <typename Kernel>
typename cutlass::conv::device::ImplicitGemmConvolution<Kernel>::Arguments make_arguments(
    Conv2dFusedArgs const& a) {
  using Conv = cutlass::conv::device::ImplicitGemmConvolution<Kernel>;
  using ElementA = typename Conv::ElementA;
  using ElementB = typename Conv::ElementB;
  using ElementC = typename Conv::ElementC;
  using LayoutA = typename Conv::LayoutA;
  using LayoutB = typename Conv::LayoutB;
  using LayoutC = typename Conv::LayoutC;
  using OutputOp = typename Conv::EpilogueOutputOp;

  cutlass::conv::Conv2dProblemSize problem(
      a.N, a.H, a.W, a.C, a.K, a.R, a.S, a.P, a.Q, a.pad_h, a.pad_w, a.stride_h, a.stride_w,
      /*dilation*/ 1, 1, cutlass::conv::Mode::kCrossCorrelation, a.split_k_slices);

  cutlass::TensorRef<ElementA, LayoutA> ref_a(
      static_cast<ElementA*>(const_cast<void*>(a.input)), LayoutA::packed({a.N, a.H, a.W, a.C}));
  cutlass::TensorRef<ElementB, LayoutB> ref_b(
      static_cast<ElementB*>(const_cast<void*>(a.weight)), LayoutB::packed({a.K, a.R, a.S, a.C}));
  LayoutC layout_c = LayoutC::packed({a.N, a.P, a.Q, a.K});
  cutlass::TensorRef<ElementC, LayoutC> ref_d(static_cast<ElementC*>(a.output), layout_c);
  // Without a residual the source is never read (is_source_needed() is false).
  cutlass::TensorRef<ElementC, LayoutC> ref_c(
      a.residual ? static_cast<ElementC*>(const_cast<void*>(a.residual)) : ref_d.data(), layout_c);

  typename OutputOp::Params output_op(a.scale, a.bias_scalar, a.post_bias, static_cast<int>(a.act),
                                      a.residual != nullptr);
  return typename Conv::Arguments(problem, ref_a, ref_b, ref_c, ref_d, output_op,
                                  cutlass::conv::SplitKMode::kSerial,
                                  const_cast<float*>(a.bias), /*ptr_Tensor*/ nullptr,
                                  /*ldr: same bias row for every output row*/ 0, /*ldt*/ 0);
}

// cutlass::Kernel<Kernel> (device_kernel.h) with the programmatic-launch wait in front.
template <typename Kernel>
__global__ void conv2d_fused_kernel(typename Kernel::Params params) {
  wait_for_previous_grid();
  extern __shared__ int shared_storage_base[];
  Kernel op;
  op(params, *reinterpret_cast<typename Kernel::SharedStorage*>(shared_storage_base));
}

// Runs the kernel; returns kErrorMisalignedOperand etc. from can_implement() untouched,
// so the dispatcher can try the next entry.  What ImplicitGemmConvolution's initialize()
// and run() do, but launched through launch_kernel() (programmatic dependent launch).
template <typename Kernel>
cutlass::Status run_instance(Conv2dFusedArgs const& a, cudaStream_t stream) {
  using Conv = cutlass::conv::device::ImplicitGemmConvolution<Kernel>;
  auto arguments = make_arguments<Kernel>(a);
  cutlass::Status status = Conv::can_implement(arguments);
  if (status != cutlass::Status::kSuccess) return status;
  size_t workspace_bytes = Conv::get_workspace_size(arguments);
  if (workspace_bytes > a.workspace_bytes) return cutlass::Status::kErrorWorkspaceNull;
  if (a.split_k_slices > 1 && cudaMemsetAsync(a.workspace, 0, workspace_bytes, stream) != cudaSuccess) {
    return cutlass::Status::kErrorInternal;  // the split-K semaphores start at zero
  }
  typename Kernel::Params params(arguments, static_cast<int*>(a.workspace));
  int smem = int(sizeof(typename Kernel::SharedStorage));
  if (smem >= (48 << 10) &&
      cudaFuncSetAttribute(conv2d_fused_kernel<Kernel>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           smem) != cudaSuccess) {
    return cutlass::Status::kErrorInternal;
  }
  dim3 grid = typename Conv::ThreadblockSwizzle().get_grid_shape(params.grid_tiled_shape);
  dim3 block(32 * Conv::kWarpCount, 1, 1);
  cudaError_t err = launch_kernel<conv2d_fused_kernel<Kernel>>(grid, block, smem, stream,
                                                               a.programmatic_launch, params);
  return err == cudaSuccess ? cutlass::Status::kSuccess : cutlass::Status::kErrorInternal;
}

}  // namespace conv2d_fused
}  // namespace cutlass_ops
