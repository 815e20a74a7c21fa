// A hand-written Hopper (sm_90a) kernel for one conv2d_fused problem class: 3x3, stride 1,
// pad 1, C = K = 64, 16-wide maps (FusedResNet's block 0 at 64x64 inputs), fp16/bf16, no
// residual.  It reads each input tile once with its halo instead of nine times through
// im2col (design and measurements: docs/experiments/sm90_halo_conv).  Built with the
// family-90 kernels; the dispatcher tries it before the generated ones (see launch()), and
// conv2d_dgrad runs block 0's dgrad through it (conv2d_backward_cuda.cpp: dgrad_by_halo).
#pragma once

#include "conv2d_fused/conv2d_fused_dispatch.h"

namespace cutlass_ops {
namespace conv2d_fused {

// The halo kernels of this build (fp16, bf16); an empty list when it has no family 90.
extern const KernelEntry kHaloKernels[];
extern const int kNumHaloKernels;

}  // namespace conv2d_fused
}  // namespace cutlass_ops
