// Torch-side pieces shared by the CPU and CUDA implementations of cutlass_ops::scale_samples.
#pragma once

#include "common/torch_stable.h"

namespace cutlass_ops {
namespace sample_scale {

// Checks shapes, dtypes and devices (errors name the argument).
void check_inputs(Tensor const& x, Tensor const& scale);

// x * scale[n] per sample by ATen in scale's dtype, rounded once to x's dtype: the CPU
// implementation and the CUDA fallback.
Tensor scale_samples_aten(Tensor const& x, Tensor const& scale);

}  // namespace sample_scale
}  // namespace cutlass_ops
