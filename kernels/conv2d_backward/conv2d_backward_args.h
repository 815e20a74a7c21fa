// Plain description of one conv backward launch (dgrad or wgrad), shared by the torch op,
// the generated kernel instances and the dispatcher.  No torch and no CUTLASS types here.
#pragma once

#include <cstddef>

namespace cutlass_ops {
namespace conv2d_backward {

enum class DType { kF16, kBF16 };
enum class ConvKind { kDgrad, kWgrad };

// Gradients of y = conv(x, w): x [N,H,W,C] (NHWC), w [K,R,S,C] (KRSC), dy [N,P,Q,K] (NPQK),
// all densely packed.
//   dgrad: dx [N,H,W,C] in dtype = scale * conv_transpose(dy, w); scale is a device float
//          (the FixUp scale, read in the epilogue) or null (1).
//   wgrad: dw in float32 (not rounded to dtype): split_k_slices partial sums over N*P*Q,
//          slice i at output + i*K*R*S*C; the caller adds them up (one slice: dw itself).
struct Conv2dBackwardArgs {
  ConvKind kind;
  DType dtype;
  int N, H, W, C;        // input
  int K, R, S;           // weight
  int P, Q;              // output
  int pad_h, pad_w, stride_h, stride_w;
  void const* grad_output;   // dy
  void const* weight;        // dgrad only
  void const* input;         // wgrad only
  void* output;              // dx, or the float32 dw slices
  float const* scale = nullptr;
  int split_k_slices = 1;    // wgrad only (parallel split-K); dgrad runs unsplit
};

}  // namespace conv2d_backward
}  // namespace cutlass_ops
