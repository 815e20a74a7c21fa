// LayerNorm over the last dimension of narrow rows (C up to 2048; CvT's 64/192/384), optionally
// fused with the residual add before it:
//   s = x + residual (rounded to the dtype, written: the next residual)   [with a residual]
//   y = (s - mean) * rstd * weight + bias,  mean/rstd in float32 (written: the backward's)
// One pass, fp16/bf16 in and out, float32 statistics and arithmetic (CvT computes its
// LayerNorms in float32); weight and bias read as float32 or in x's dtype (converted exactly).  A row is handled by 4-32 lanes of a warp, so a warp takes
// 1-8 rows at once (ATen's kernel spends a block on each row: 307 us for a 200704 x 64
// LayerNorm on an H100, docs/results/cvt_fp16_h100_n64.json).  No torch here: the device code is
// layer_norm_device.cuh (also run on the CPU emulator, tests/cuda_emulator), the torch side
// layer_norm_cuda.cpp.
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

// Whether the kernel covers `cols` with these pointers (else the caller runs ATen's).
bool layer_norm_supported(LayerNormArgs const& a);

// Returns the launch's cudaError.
cudaError_t launch_layer_norm(LayerNormArgs const& a, int num_sms, cudaStream_t stream);

}  // namespace layer_norm
}  // namespace cutlass_ops
