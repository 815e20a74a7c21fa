// Included by every generated dgrad/wgrad instance: runs one CUTLASS kernel type on a
// Conv2dBackwardArgs, or (workspace query) only says whether it can.
#pragma once

#include <cuda_runtime.h>

#include "cutlass/conv/conv2d_problem_size.h"
#include "cutlass/conv/device/implicit_gemm_convolution.h"
#include "cutlass/conv/kernel/default_conv2d_dgrad.h"
#include "cutlass/conv/kernel/default_conv2d_wgrad.h"
#include "cutlass/cutlass.h"
#include "cutlass/device_kernel.h"
#include "cutlass/epilogue/thread/linear_combination.h"
#include "cutlass/numeric_types.h"

#include "conv2d_backward/conv2d_backward_args.h"

namespace cutlass_ops {
namespace conv2d_backward {

template <typename Kernel>
typename cutlass::conv::device::ImplicitGemmConvolution<Kernel>::Arguments make_arguments(
    Conv2dBackwardArgs const& a) {
  using Conv = cutlass::conv::device::ImplicitGemmConvolution<Kernel>;
  using ElementA = typename Conv::ElementA;
  using ElementB = typename Conv::ElementB;
  using ElementC = typename Conv::ElementC;
  using LayoutA = typename Conv::LayoutA;
  using LayoutB = typename Conv::LayoutB;
  using LayoutC = typename Conv::LayoutC;
  using OutputOp = typename Conv::EpilogueOutputOp;
  constexpr bool kDgrad = Conv::kConvolutionalOperator == cutlass::conv::Operator::kDgrad;

  cutlass::conv::Conv2dProblemSize problem(
      a.N, a.H, a.W, a.C, a.K, a.R, a.S, a.P, a.Q, a.pad_h, a.pad_w, a.stride_h, a.stride_w,
      /*dilation*/ 1, 1, cutlass::conv::Mode::kCrossCorrelation, a.split_k_slices);

  // Both kinds read dy as A; B is w (dgrad) or x (wgrad); C/D is dx or dw.
  cutlass::TensorRef<ElementA, LayoutA> ref_a(
      static_cast<ElementA*>(const_cast<void*>(a.grad_output)), LayoutA::packed({a.N, a.P, a.Q, a.K}));
  cutlass::TensorRef<ElementB, LayoutB> ref_b(
      static_cast<ElementB*>(const_cast<void*>(kDgrad ? a.weight : a.input)),
      kDgrad ? LayoutB::packed({a.K, a.R, a.S, a.C}) : LayoutB::packed({a.N, a.H, a.W, a.C}));
  LayoutC layout_c = kDgrad ? LayoutC::packed({a.N, a.H, a.W, a.C}) : LayoutC::packed({a.K, a.R, a.S, a.C});
  cutlass::TensorRef<ElementC, LayoutC> ref_d(static_cast<ElementC*>(a.output), layout_c);
  // beta = 0: the source is never read.
  typename OutputOp::Params output_op =
      a.scale != nullptr ? typename OutputOp::Params(a.scale) : typename OutputOp::Params(1.0f, 0.0f);
  // Parallel split-K: slice i writes its partial sums at output + i * (size of D).
  auto mode = a.split_k_slices > 1 ? cutlass::conv::SplitKMode::kParallel : cutlass::conv::SplitKMode::kSerial;
  return typename Conv::Arguments(problem, ref_a, ref_b, ref_d, ref_d, output_op, mode);
}

// With `query` set: returns can_implement()'s verdict and launches nothing.  Otherwise
// launches; kErrorInternal is a failed launch.
template <typename Kernel>
cutlass::Status run_instance(Conv2dBackwardArgs const& a, cudaStream_t stream, bool query) {
  using Conv = cutlass::conv::device::ImplicitGemmConvolution<Kernel>;
  auto arguments = make_arguments<Kernel>(a);
  cutlass::Status status = Conv::can_implement(arguments);
  if (status != cutlass::Status::kSuccess || query) return status;
  // Parallel split-K needs no semaphores; unsplit kernels none either.
  typename Kernel::Params params(arguments, nullptr);
  int smem = int(sizeof(typename Kernel::SharedStorage));
  if (smem >= (48 << 10) &&
      cudaFuncSetAttribute(cutlass::Kernel<Kernel>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) !=
          cudaSuccess) {
    return cutlass::Status::kErrorInternal;
  }
  dim3 grid = typename Conv::ThreadblockSwizzle().get_grid_shape(params.grid_tiled_shape);
  dim3 block(32 * Conv::kWarpCount, 1, 1);
  cutlass::Kernel<Kernel><<<grid, block, smem, stream>>>(params);
  return cudaPeekAtLastError() == cudaSuccess ? cutlass::Status::kSuccess : cutlass::Status::kErrorInternal;
}

}  // namespace conv2d_backward
}  // namespace cutlass_ops
