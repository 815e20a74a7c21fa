// What the back-to-back conv kernels take (no torch, no CUTLASS types): the generated
// instances (conv2d_b2b_instance.cuh), their dispatch table and the C++ tests see only this.
#pragma once

#include <cuda_runtime.h>

#include "cutlass/cutlass.h"

namespace cutlass_ops {
namespace conv2d_b2b {

enum class DType { kF16, kBF16 };

// y = relu(conv1x1(relu(conv(x, w0) + bias0), w1) + bias1), NHWC, one kernel: the first conv's
// output tile stays in registers and feeds the second conv (CUTLASS's B2B fusion,
// examples/13_two_tensor_op_fusion).  bias0: float32 (K0); bias1: the input dtype (K1).
struct Conv2dB2bArgs {
  DType dtype;
  int N, H, W, C;      // input
  int K0, R, S;        // the first conv's filters (K0, R, S, C)
  int P, Q;            // its output, which is the second conv's input
  int K1;              // the second conv's filters (K1, 1, 1, K0)
  int pad_h, pad_w, stride_h, stride_w;
  void const* input;
  void const* w0;
  float const* bias0;
  void const* w1;
  void const* bias1;
  void* output;
};

using KernelFn = cutlass::Status (*)(Conv2dB2bArgs const&, cudaStream_t);

struct KernelEntry {
  char const* name;
  DType dtype;
  int k0, k1;  // the channel counts the instance computes: the thread block tiles' N
  KernelFn run;
};

// The generated table (conv2d_b2b_dispatch_table.cpp in the build tree).
extern const KernelEntry kKernels[];
extern const int kNumKernels;

}  // namespace conv2d_b2b
}  // namespace cutlass_ops
