// LayerNorm over the last dimension of narrow rows (C up to 2048; CvT's 64/192/384), optionally
// fused with the residual add before it:
//   s = x + residual (rounded to the dtype, written: the next residual)   [with a residual]
//   y = (s - mean) * rstd * weight + bias,  mean/rstd in float32 (written: the backward's)
// One pass, fp16/bf16 in and out, float32 statistics and arithmetic (CvT computes its
// LayerNorms in float32); weight and bias read as float32 or in x's dtype (converted exactly).  A row is handled by 4-32 lanes of a warp, so a warp takes
// 1-8 rows at once (ATen's kernel spends a block on each row: 307 us for a 200704 x 64
// LayerNorm on an H100, in CvT-13's fp16 forward at N=64).  No torch here: the device code is
// layer_norm_rows_device.cuh (also run on the CPU emulator, tests/cuda_emulator), the torch side
// layer_norm_rows_cuda.cpp.
#pragma once

#include <cuda_runtime.h>

namespace cutlass_ops {
namespace layer_norm {

enum class DType { kF16, kBF16 };

struct LayerNormArgs {
  DType dtype;
  long long rows;
  int cols;
  float eps;
  void const* x;         // (rows, cols), rows contiguous
  void const* residual;  // same shape, or null
  void const* weight;    // (cols), or null: 1
  void const* bias;      // (cols), or null: 0
  bool params_f32;       // weight and bias are float32 (else x's dtype: no cast kernel per call)
  void* y;               // (rows, cols)
  void* sum;             // (rows, cols): x + residual (null without a residual)
  float* mean;           // (rows)
  float* rstd;           // (rows)
};

// The backward, one pass over the rows (layer_norm_backward_kernel):
//   grad_x = rstd * (g - mean(g) - xhat * mean(g * xhat)) + grad_sum,  g = grad_y * weight,
//   xhat = (s - mean) * rstd, per row; and, with partials, each CTA's sums over its rows of
//   grad_y * xhat and grad_y, for the caller to add up into the weight's and bias's gradients.
struct LayerNormBackwardArgs {
  DType dtype;
  long long rows;
  int cols;
  void const* grad_y;    // (rows, cols)
  void const* grad_sum;  // (rows, cols): the gradient reaching s from its other users, or null
  void const* s;         // (rows, cols): the forward's normalized input (x + residual)
  float const* mean;     // (rows)
  float const* rstd;     // (rows)
  void const* weight;    // (cols), or null: 1
  bool params_f32;       // weight is float32 (else s's dtype)
  void* grad_x;          // (rows, cols)
  float* partials;       // (2, partial_rows, cols): the weight's, then the bias's; or null
  long long partial_rows;  // layer_norm_backward_partial_rows(): one row per CTA of the grid
};

// Whether the kernel covers `cols` with these pointers (else the caller runs ATen's).
bool layer_norm_supported(LayerNormArgs const& a);
bool layer_norm_backward_supported(LayerNormBackwardArgs const& a);

// Rows of the backward's partial sums (the grid's CTAs) for `rows` rows on `num_sms` SMs.
long long layer_norm_backward_partial_rows(LayerNormBackwardArgs const& a, int num_sms);

// Return the launch's cudaError.
cudaError_t launch_layer_norm(LayerNormArgs const& a, int num_sms, cudaStream_t stream);
cudaError_t launch_layer_norm_backward(LayerNormBackwardArgs const& a, int num_sms, cudaStream_t stream);

}  // namespace layer_norm
}  // namespace cutlass_ops
