// Torch-side pieces shared by the CPU and CUDA implementations of cutlass_ops::conv2d_fused.
#pragma once

#include <ATen/ATen.h>

#include <string>

namespace cutlass_ops {
namespace conv2d_fused {

struct OutputShape {
  int64_t N, K, P, Q;
};

// Checks everything that does not depend on the device and returns the output shape.
// Errors are TORCH_CHECKs (RuntimeError/ValueError in Python) that name the argument.
OutputShape check_inputs(at::Tensor const& input, at::Tensor const& weight,
                         c10::optional<at::Tensor> const& bias,
                         c10::optional<at::Tensor> const& residual,
                         c10::optional<at::Tensor> const& scale,
                         c10::optional<at::Tensor> const& post_bias, at::IntArrayRef stride,
                         at::IntArrayRef padding);

// The ATen composite: the CPU implementation, and the CUDA fallback for dtypes or shapes
// no generated kernel covers.  Computes in float32 (float64 for double inputs).
at::Tensor conv2d_fused_aten(at::Tensor const& input, at::Tensor const& weight,
                             c10::optional<at::Tensor> const& bias,
                             c10::optional<at::Tensor> const& residual,
                             c10::optional<at::Tensor> const& scale,
                             c10::optional<at::Tensor> const& post_bias, at::IntArrayRef stride,
                             at::IntArrayRef padding, bool relu);

// Name of the kernel the last conv2d_fused call on this thread ran ("aten" for the ATen
// path); last_kernel_slot() is where the implementations record it.
std::string& last_kernel_slot();
std::string last_kernel();

// The profiler's override on this thread: a kernel the CUDA implementation must run
// ("" = choose as usual) and its serial split-K slices (0 = the dispatcher's choice).
// Set through cutlass_ops::conv2d_fused_force_kernel.
struct ForcedChoice {
  std::string kernel;
  int split_k = 0;
};
ForcedChoice& forced_choice_slot();

}  // namespace conv2d_fused
}  // namespace cutlass_ops
