// Depthwise 3x3 conv (padding 1, stride 1 or 2) with a per-channel bias on an NHWC map held as
// tokens (N, H*W, C), writing tokens (N, lead + Ho*Wo, C): the first `lead` rows of each image
// copied from `lead_tokens` (CvT's cls token), the conv's rows after them.  CvT's dw_bn q/k/v
// projections in eval mode (BatchNorm folded into weight and bias) then need no bias add and
// no concatenation after cuDNN's depthwise conv.  Float32 arithmetic, fp16/bf16 in and out.
// No torch here: the device code is dw_conv_device.cuh (also run on the CPU emulator,
// tests/cuda_emulator), the torch side dw_conv_cuda.cpp.
#pragma once

#include <cuda_runtime.h>

namespace cutlass_ops {
namespace dw_conv {

enum class DType { kF16, kBF16 };

struct DwConvArgs {
  DType dtype;
  long long n;            // images
  int h, w, c;            // input map
  int stride;             // 1 or 2
  int ho, wo;             // output map: (h - 1) / stride + 1, (w - 1) / stride + 1
  int lead;               // rows before the conv's in each output image
  void const* x;          // (n, h*w, c), rows contiguous
  long long x_image_stride;  // elements from one image's first row to the next's (h*w*c when dense;
                             // more for a view that skips a leading row: CvT's tokens less the cls)
  void const* weight;     // (c, 1, 3, 3)
  void const* bias;       // (c), or null
  bool params_f32;        // weight and bias are float32 (else x's dtype)
  void const* lead_tokens;  // (n, lead, c), or null when lead == 0
  void* y;                // (n, lead + ho*wo, c)
};

// Returns the launch's cudaError.
cudaError_t launch_dw_conv(DwConvArgs const& a, int num_sms, cudaStream_t stream);

}  // namespace dw_conv
}  // namespace cutlass_ops
