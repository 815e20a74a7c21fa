// Torch-side pieces shared by the CPU and CUDA implementations of cutlass_ops::dw_conv3x3_tokens.
#pragma once

#include <optional>
#include <utility>
#include <vector>

#include "common/torch_stable.h"

namespace cutlass_ops {
namespace dw_conv {

// Checks shapes, dtypes and devices (errors name the argument); returns each projection's
// output map (Ho, Wo).
std::vector<std::pair<int64_t, int64_t>> check_inputs(Tensor const& x, int64_t h, int64_t w, Tensor const& weight,
                                                      std::optional<Tensor> const& bias, IntArrayRef strides,
                                                      std::optional<Tensor> const& lead);

// aten::conv2d (groups = C) in float32 (float64 for float64) on the map per projection, its
// bias, the lead rows in front: the CPU implementation and the CUDA fallback.
std::vector<Tensor> dw_conv3x3_tokens_aten(Tensor const& x, int64_t h, int64_t w, Tensor const& weight,
                                           std::optional<Tensor> const& bias, IntArrayRef strides,
                                           std::optional<Tensor> const& lead);

// layer_norm_dw_conv3x3_tokens: the LayerNorm's arguments checked (ln_weight, ln_bias: (C) or
// None, floating, on x's device; eps finite and >= 0) besides check_inputs'.
void check_layer_norm(Tensor const& x, std::optional<Tensor> const& ln_weight, std::optional<Tensor> const& ln_bias,
                      double eps);

// LayerNorm over the last dimension in float32 (float64 for float64), rounded to t's dtype (as
// layer_norm_rows computes it): the CPU path of layer_norm_dw_conv3x3_tokens and its CUDA
// fallback where the tiled kernel does not run.
Tensor layer_norm_last_dim(Tensor const& t, std::optional<Tensor> const& ln_weight,
                           std::optional<Tensor> const& ln_bias, double eps);

// dw_conv3x3_tokens_aten on layer_norm_last_dim(x) and (lead).
std::vector<Tensor> layer_norm_dw_conv3x3_tokens_aten(Tensor const& x, int64_t h, int64_t w,
                                                      std::optional<Tensor> const& ln_weight,
                                                      std::optional<Tensor> const& ln_bias, double eps,
                                                      Tensor const& weight, std::optional<Tensor> const& bias,
                                                      IntArrayRef strides, std::optional<Tensor> const& lead);

// The input gradient of dw_conv3x3_tokens's convs: grad_y[j] (N, Ho_j*Wo_j, C) (the conv rows
// of output j; each image's rows contiguous, images may be apart) -> grad_x (N, h*w, C).  Checks
// shapes, dtypes and devices; returns each projection's (Ho, Wo).
std::vector<std::pair<int64_t, int64_t>> check_backward_inputs(std::vector<Tensor> const& grad_y, int64_t h,
                                                               int64_t w, Tensor const& weight, IntArrayRef strides);

// sum_j conv_transpose2d(grad_y[j]) by ATen in float32 (float64 for float64): the CPU
// implementation and the CUDA fallback.
Tensor dw_conv3x3_tokens_backward_input_aten(std::vector<Tensor> const& grad_y, int64_t h, int64_t w,
                                             Tensor const& weight, IntArrayRef strides);

}  // namespace dw_conv
}  // namespace cutlass_ops
