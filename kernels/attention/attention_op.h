// Torch-side pieces shared by the CPU and CUDA implementations of cutlass_ops::attention_tokens.
#pragma once

#include "common/torch_stable.h"

namespace cutlass_ops {
namespace attention {

// Checks shapes, dtypes and devices (errors name the argument).
void check_inputs(Tensor const& q, Tensor const& k, Tensor const& v, int64_t heads, double scale);

// softmax(scale q_h k_h^T) v_h per head by ATen in float32 (float64 for float64), rounded once:
// the CPU implementation and the CUDA fallback.
Tensor attention_tokens_aten(Tensor const& q, Tensor const& k, Tensor const& v, int64_t heads, double scale);

}  // namespace attention
}  // namespace cutlass_ops
