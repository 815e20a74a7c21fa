// Torch-side pieces shared by the CPU and CUDA implementations of cutlass_ops::conv2d_dgrad
// and cutlass_ops::conv2d_wgrad (the training path's conv gradients).
#pragma once

#include <string>
#include <tuple>

#include "common/torch_stable.h"

namespace cutlass_ops {
namespace conv2d_backward {

// The forward conv y = conv(x, w) (N, C, H, W) * (K, C, R, S) -> (N, K, P, Q) both ops
// differentiate, as the checks establish it.
struct ConvShape {
  int64_t N, C, H, W, K, R, S, P, Q;
};

// Checks dy against the conv that x_size (or x), w_size (or w), stride and padding describe.
ConvShape check_dgrad(Tensor const& grad_output, Tensor const& weight, IntArrayRef input_size, IntArrayRef stride,
                      IntArrayRef padding, std::optional<Tensor> const& scale);
ConvShape check_wgrad(Tensor const& grad_output, Tensor const& input, Tensor const& weight, IntArrayRef stride,
                      IntArrayRef padding, std::optional<Tensor> const& scale);

// The ATen composites (CPU, and the CUDA fallback: cuDNN there).  16-bit CUDA tensors stay
// 16-bit (float32 accumulation, as PyTorch's own backward); otherwise float32/float64.
Tensor conv2d_dgrad_aten(Tensor const& grad_output, Tensor const& weight, IntArrayRef input_size, IntArrayRef stride,
                         IntArrayRef padding, std::optional<Tensor> const& scale);
// (scale * G, <weight, G>) with G = wgrad(grad_output, input): FixUp's gradients of w and
// of the scale in y = scale * conv(x, w).
std::tuple<Tensor, Tensor> conv2d_wgrad_aten(Tensor const& grad_output, Tensor const& input, Tensor const& weight,
                                             IntArrayRef stride, IntArrayRef padding,
                                             std::optional<Tensor> const& scale);

// The kernel the last conv2d_dgrad / conv2d_wgrad call on this thread ran ("aten" for the
// ATen path; "+ sum of N slices" after a split wgrad).
std::string& last_kernel_slot();
std::string last_kernel();

// The profiler's override on this thread (cutlass_ops::conv2d_backward_force_kernel): the
// kernel the CUDA implementations must run ("" = choose as usual) and wgrad's split-K
// slices (0 = the dispatcher's choice).
struct ForcedChoice {
  std::string kernel;
  int split_k = 0;
};
ForcedChoice& forced_choice_slot();
// cutlass_ops::conv2d_backward_force_kernel: checks split_k and sets forced_choice_slot().
void force_kernel(std::string name, int64_t split_k);

}  // namespace conv2d_backward
}  // namespace cutlass_ops
