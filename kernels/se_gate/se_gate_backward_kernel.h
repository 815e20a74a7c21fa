// The whole backward of se_gate (se_gate_kernel.h), in three kernels:
//   1. reduce, one CTA per image (streaming):
//        g       = grad_out + AvgPool2d(3, 2, 1)'s backward of grad_pooled  (when pooled)
//        dy      = g where the ReLU was active, else 0  (the gradient of h*gate + identity)
//        squeeze = mean_hw(h),  d_gate = sum_hw(dy * h),  and the image's sums of g and dy
//   2. excite, one CTA per 1-8 images (the excite weights read once per group):
//        the gate recomputed from the squeeze; d_pre2 = d_gate * gate * (1 - gate),
//        d_pre1 = (d_pre2 W2) * (pre1 > 0), d_squeeze = d_pre1 W1
//   3. input gradient (streaming): grad_h = dy * gate + d_squeeze / (H*W), and sum(grad_h)
// The ReLU mask comes from the saved output: an inactive element holds exactly post_bias
// rounded to the output dtype (as relu_backward).  The per-image vectors stay in global
// memory; launch_se_gate_param_grads then reduces them over the batch into the excite
// weights' and FixUp scalars' gradients (two kernels: per chunk of images, then over the
// chunks; cuBLAS ran these skinny GEMMs on one or two CTAs).
// NHWC (channels_last) fp16/bf16, float accumulation, deterministic (no atomics).  No torch here.
#pragma once

#include <cuda_runtime.h>

#include "se_gate/se_gate_kernel.h"

namespace cutlass_ops {
namespace se_gate {

struct SeGateBackwardArgs {
  DType dtype;
  int N, H, W, C, R;
  int P, Q;                          // the pooled map's size, when grad_pooled is given
  void const* grad_out;              // [N, H, W, C]
  void const* grad_pooled;           // [N, P, Q, C], or null: no fused pool
  void const* h;                     // [N, H, W, C]: se_gate's input h
  void const* out;                   // [N, H, W, C]: se_gate's saved output
  float const* w1; float const* b1;  // (R, C), (R); W1 and W2 16-byte aligned
  float const* w2; float const* b2;  // (C, R), (C)
  float const* post_bias;            // device scalar or null
  float const* h_bias;               // device scalar or null (se_gate's h_bias)
  void* grad_y;                      // [N, H, W, C]: dy, which is also identity's gradient
  void* grad_h;                      // [N, H, W, C]
  // float32 per-image vectors, 16-byte aligned: written by one kernel, read by the next or
  // by the op (squeeze, hidden, d_pre1, d_pre2, sums).
  float* squeeze;                    // [N, C]
  float* d_gate;                     // [N, C]
  float* gate;                       // [N, C]
  float* d_squeeze;                  // [N, C], divided by H*W
  float* hidden;                     // [N, R]
  float* d_pre1;                     // [N, R]
  float* d_pre2;                     // [N, C]
  float* sums;                       // [N, 2]: per image sum(g), sum(dy)
  // sum(grad_h) (h_bias's gradient), added over the input kernel's blocks by its last one:
  float* grad_h_partials;            // [se_gate_backward_input_blocks(...)]
  unsigned* grad_h_counter;          // one word of scratch (the reduce kernel zeroes it)
  float* grad_h_sum;                 // [1]
  bool programmatic_launch;          // see common/programmatic_launch.cuh
};

// Whether the kernels take C channels and R hidden units: C % 8 == 0, C <= 2048, and W2
// fits in shared memory (C * (R + 1) floats and a little more).  Otherwise the op runs ATen.
bool se_gate_backward_supported(int C, int R, size_t max_smem_bytes);

// Shared memory the excite kernel needs (bytes).
size_t se_gate_backward_smem_bytes(int C, int R, int images_per_cta);

// Blocks of the input-gradient kernel (the grad_h_partials entries to allocate).
int se_gate_backward_input_blocks(int N, int H, int W, int C, int num_sms);

// Images per excite CTA (1, 2, 4 or 8): as many as still leave a CTA for every SM and fit.
int se_gate_backward_images_per_cta(int N, int C, int R, int num_sms, size_t max_smem_bytes);

// Requirements: se_gate_backward_supported(C, R, ...), 16-byte aligned 16-bit tensors, W1 and W2.
// Kernels 1 and 2 (the per-image vectors), then kernel 3 (grad_h): separate calls, so that the
// op can run the batch sums (launch_se_gate_param_grads) beside kernel 3.  Return the first
// launch error.
cudaError_t launch_se_gate_backward_per_image(SeGateBackwardArgs const& a, int images_per_cta,
                                              cudaStream_t stream);
cudaError_t launch_se_gate_backward_input(SeGateBackwardArgs const& a, int num_sms, cudaStream_t stream);

// The batch sums over se_gate_backward's per-image vectors:
//   grad_w1[r][c] = sum_n d_pre1[n][r] * squeeze[n][c]    grad_b1[r] = sum_n d_pre1[n][r]
//   grad_w2[c][r] = sum_n d_pre2[n][c] * hidden[n][r]     grad_b2[c] = sum_n d_pre2[n][c]
//   scalars[0] = sum_n sums[n][1] (identity_bias),        scalars[1] = sum_n sums[n][0] (post_bias)
struct SeParamGradArgs {
  int N, C, R;
  float const* squeeze; float const* hidden; float const* d_pre1; float const* d_pre2; float const* sums;
  float* partials;                   // [chunks][se_param_grad_entries(C, R)]
  float* grad_w1; float* grad_b1; float* grad_w2; float* grad_b2;
  float* grad_identity_bias; float* grad_post_bias;
};

int se_param_grad_entries(int C, int R);
// Chunks of images the first kernel splits the batch into (the partials rows to allocate).
int se_param_grad_chunks(int N, int C, int R);
cudaError_t launch_se_gate_param_grads(SeParamGradArgs const& a, int chunks, cudaStream_t stream);

}  // namespace se_gate
}  // namespace cutlass_ops
