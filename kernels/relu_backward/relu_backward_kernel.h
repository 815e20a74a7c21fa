// Backward of the ops' "relu(z) + post_bias" epilogues, with the FixUp scalar gradients:
//   grad_z = (z > 0) ? grad : 0,   where z > 0  <=>  out != round(post_bias)  (out > 0 without)
//   sums   = (sum(grad), sum(grad_z))            (d post_bias, d of a scalar bias before the ReLU)
// The ops compute in float32 and round once, so an element with z <= 0 stores exactly
// post_bias rounded to the output dtype: the mask needs only the saved output.
// One pass, fp16/bf16, float accumulation; the last block adds the per-block sums in a
// fixed order (common/grid_sum.cuh: the result does not depend on scheduling).  No torch here: relu_backward_cuda.cpp calls the launcher.
#pragma once

#include <cuda_runtime.h>

namespace cutlass_ops {
namespace relu_backward {

enum class DType { kF16, kBF16 };

struct ReluBackwardArgs {
  DType dtype;
  long long numel;
  void const* grad;
  void const* out;
  float const* post_bias;  // device scalar, or null: the mask is out > 0
  void* grad_z;            // same layout as grad and out
  float* partial_sums;     // [blocks][2]: per block, sum(grad) and sum(grad_z)
  unsigned* counter;       // one word of scratch (the launcher zeroes it)
  float* sums;             // [2]: sum(grad), sum(grad_z), added by the last block
};

// Blocks the launch uses for `numel` elements (the partial_sums rows to allocate).
int relu_backward_blocks(long long numel, int num_sms);

// 16-byte vectors when numel % 8 == 0 and the pointers are 16-byte aligned.  Returns the
// launch's cudaError.
cudaError_t launch_relu_backward(ReluBackwardArgs const& a, int blocks, cudaStream_t stream);

}  // namespace relu_backward
}  // namespace cutlass_ops
