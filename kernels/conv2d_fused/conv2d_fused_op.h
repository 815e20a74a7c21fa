// Torch-side pieces shared by the CPU and CUDA implementations of cutlass_ops::conv2d_fused.
#pragma once

#include <string>
#include <tuple>

#include "common/torch_stable.h"

namespace cutlass_ops {
namespace conv2d_fused {

struct OutputShape {
  int64_t N, K, P, Q;
};

// Checks everything that does not depend on the device and returns the output shape.
// Errors are CUTLASS_OPS_CHECKs (RuntimeError/ValueError in Python) that name the argument.
// relu and silu are not both set.
void check_activation(bool relu, bool silu);

OutputShape check_inputs(Tensor const& input, Tensor const& weight, std::optional<Tensor> const& bias,
                         std::optional<Tensor> const& residual, std::optional<Tensor> const& scale,
                         std::optional<Tensor> const& post_bias, IntArrayRef stride, IntArrayRef padding);

// The ATen composite: the CPU implementation, and the CUDA fallback for dtypes or shapes
// no generated kernel covers.  Computes in float32 (float64 for double inputs).
Tensor conv2d_fused_aten(Tensor const& input, Tensor const& weight, std::optional<Tensor> const& bias,
                         std::optional<Tensor> const& residual, std::optional<Tensor> const& scale,
                         std::optional<Tensor> const& post_bias, IntArrayRef stride, IntArrayRef padding,
                         bool relu, bool silu);

// conv2d_fused_se_gate(input, weight, scale, identity, fc1/fc2, identity_bias, post_bias,
// avgpool, h_bias, stride, padding): se_gate (kernels/se_gate) with h = scale * conv2d(input,
// weight) + h_bias as its input:
//   out    = relu(h * sigmoid(fc2(relu(fc1(mean_hw(h))))) + identity + identity_bias) + post_bias
//   pooled = avg_pool2d(out, 3, 2, 1, count_include_pad)   (of the rounded out; empty unless avgpool)
// Checks every argument (errors name it) and returns the output shape.
OutputShape check_se_gate_inputs(Tensor const& input, Tensor const& weight, std::optional<Tensor> const& scale,
                                 Tensor const& identity, Tensor const& w1, Tensor const& b1, Tensor const& w2,
                                 Tensor const& b2, std::optional<Tensor> const& identity_bias,
                                 std::optional<Tensor> const& post_bias, std::optional<Tensor> const& h_bias,
                                 IntArrayRef stride, IntArrayRef padding);

// Its ATen composite: the CPU implementation and the CUDA path for float32/float64.
std::tuple<Tensor, Tensor> conv2d_fused_se_gate_aten(
    Tensor const& input, Tensor const& weight, std::optional<Tensor> const& scale, Tensor const& identity,
    Tensor const& w1, Tensor const& b1, Tensor const& w2, Tensor const& b2,
    std::optional<Tensor> const& identity_bias, std::optional<Tensor> const& post_bias, bool avgpool,
    std::optional<Tensor> const& h_bias, IntArrayRef stride, IntArrayRef padding);

// What the last conv2d_fused_se_gate call on this thread ran: the fused kernel's name, "two
// kernels (<why>)" (conv2d_fused, then se_gate), "aten" or "none (empty)".
std::string& se_gate_last_kernel_slot();
std::string se_gate_last_kernel();

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
// cutlass_ops::conv2d_fused_force_kernel: checks split_k and sets forced_choice_slot().
void force_kernel(std::string name, int64_t split_k);

}  // namespace conv2d_fused
}  // namespace cutlass_ops
