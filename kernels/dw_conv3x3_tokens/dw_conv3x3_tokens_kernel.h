// Depthwise 3x3 convs (padding 1, stride 1 or 2 each) with per-channel biases on one NHWC map
// held as tokens (N, H*W, C), up to three of them from one read of the map, each writing tokens
// (N, lead + Ho*Wo, C): the first `lead` rows of each image copied from `lead_tokens` (CvT's
// cls token), the conv's rows after them.  CvT's dw_bn q/k/v projections in eval mode
// (BatchNorm folded into weight and bias; q at stride 1, k and v at stride 2) then need one
// kernel, where cuDNN's depthwise conv took one each, with a bias add and a concatenation after
// it.  Two forward kernels (dw_conv3x3_tokens_device.cuh): a tiled one, which copies a band of rows with
// its halo into shared memory once and computes every projection's outputs centred in it, and
// a strip one for maps too wide for that band and unaligned (element-wise) inputs.  Float32
// arithmetic, fp16/bf16 in and out.  No torch here: the device code is
// dw_conv3x3_tokens_device.cuh (also run on the CPU emulator, tests/cuda_emulator), the torch side
// dw_conv3x3_tokens_cuda.cpp.
#pragma once

#include <cuda_runtime.h>

namespace cutlass_ops {
namespace dw_conv {

enum class DType { kF16, kBF16 };

constexpr int kMaxProjections = 3;

struct DwConvArgs {
  DType dtype;
  long long n;            // images
  int h, w, c;            // input map
  int projections;        // 1 .. kMaxProjections convs on the same map
  int stride[kMaxProjections];  // 1 or 2
  int ho[kMaxProjections], wo[kMaxProjections];  // output maps: (h - 1) / stride + 1, ...
  int lead;               // rows before the conv's in each output image
  void const* x;          // (n, h*w, c), rows contiguous
  long long x_image_stride;  // elements from one image's first row to the next's (h*w*c when dense;
                             // more for a view that skips a leading row: CvT's tokens less the cls)
  void const* weight;     // (projections, c, 1, 3, 3), contiguous
  void const* bias;       // (projections, c), contiguous, or null
  bool params_f32;        // weight and bias are float32 (else x's dtype)
  void const* lead_tokens;     // (n, lead, c), rows contiguous, or null when lead == 0
  long long lead_image_stride;  // elements from one image's lead rows to the next's
  void* y[kMaxProjections];     // (n, lead + ho*wo, c) each
  // layer_norm: x and lead_tokens are LayerNormed over their c channels first (the tiled kernel
  // only: dw_conv_tiled must hold), float32 statistics, the normalized value rounded to x's
  // dtype as layer_norm_rows writes it
  bool layer_norm;
  void const* ln_weight;  // (c), or null: 1
  void const* ln_bias;    // (c), or null: 0
  bool ln_params_f32;     // ln_weight and ln_bias are float32 (else x's dtype)
  float ln_eps;
};

// The input gradient of the convs above (their outputs' conv rows only; the lead rows' gradient
// is the caller's): grad_x (n, h*w, c) = the sum over the projections of each one's
// transposed conv of grad_y[j] (n, ho*wo, c).
struct DwConvBackwardArgs {
  DType dtype;
  long long n;
  int h, w, c;
  int projections;
  int stride[kMaxProjections];
  int ho[kMaxProjections], wo[kMaxProjections];
  void const* grad_y[kMaxProjections];             // each image's ho*wo rows contiguous
  long long grad_image_stride[kMaxProjections];    // elements from one image's rows to the next's
  void const* weight;                              // (projections, c, 1, 3, 3), contiguous
  bool params_f32;                                 // weight is float32 (else grad's dtype)
  void* grad_x;                                    // (n, h*w, c), contiguous
};

// Return the launch's cudaError.
cudaError_t launch_dw_conv(DwConvArgs const& a, int num_sms, cudaStream_t stream);
// Whether launch_dw_conv runs the tiled kernel for these arguments (as CUTLASS_OPS_DW_TILE and
// CUTLASS_OPS_DW_TILE_BYTES say now): required for layer_norm.
bool dw_conv_tiled(DwConvArgs const& a, int num_sms);
cudaError_t launch_dw_conv_backward_input(DwConvBackwardArgs const& a, int num_sms, cudaStream_t stream);

}  // namespace dw_conv
}  // namespace cutlass_ops
