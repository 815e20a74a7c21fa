// Torch-side pieces shared by the CPU and CUDA implementations of cutlass_ops::conv_embed.
#pragma once

#include "common/torch_stable.h"

namespace cutlass_ops {
namespace conv_embed {

struct OutputShape {
  int64_t N, K, P, Q;
};

// Checks shapes, dtypes, devices and the conv's geometry (errors name the argument); returns
// the conv's output shape.
OutputShape check_inputs(Tensor const& input, Tensor const& weight, std::optional<Tensor> const& bias,
                         IntArrayRef stride, IntArrayRef padding, bool layer_norm,
                         std::optional<Tensor> const& ln_weight, std::optional<Tensor> const& ln_bias, double eps);

// The conv, its bias and the LayerNorm by ATen in float32 (float64 for float64), rounded once to
// the input's dtype: the CPU implementation and the CUDA fallback.
Tensor conv_embed_aten(Tensor const& input, Tensor const& weight, std::optional<Tensor> const& bias,
                       IntArrayRef stride, IntArrayRef padding, bool layer_norm, std::optional<Tensor> const& ln_weight,
                       std::optional<Tensor> const& ln_bias, double eps);

}  // namespace conv_embed
}  // namespace cutlass_ops
