// Torch-side pieces shared by the CPU and CUDA implementations of cutlass_ops::conv2d_b2b.
#pragma once

#include <string>

#include "common/torch_stable.h"

namespace cutlass_ops {
namespace conv2d_b2b {

struct Shape {
  int64_t N, C, H, W, K0, R, S, P, Q, K1;
};

// Checks everything that does not depend on the device; returns the problem's sizes.
Shape check_inputs(Tensor const& input, Tensor const& w0, std::optional<Tensor> const& bias0, Tensor const& w1,
                   std::optional<Tensor> const& bias1, IntArrayRef stride, IntArrayRef padding);

// The ATen composite: the CPU implementation, and the CUDA fallback where no B2B instance
// fits.  Computes in float32 (float64 for double inputs) and rounds the first conv's output
// to the input dtype, as the fused kernel does before the second conv.
Tensor conv2d_b2b_aten(Tensor const& input, Tensor const& w0, std::optional<Tensor> const& bias0, Tensor const& w1,
                       std::optional<Tensor> const& bias1, IntArrayRef stride, IntArrayRef padding, bool relu0,
                       bool relu1);

// The kernel the last conv2d_b2b call on this thread ran ("aten" for the composite).
std::string& last_kernel_slot();

}  // namespace conv2d_b2b
}  // namespace cutlass_ops
