// Weight-sized (elementwise) kernels around the convs' dgrad/wgrad (FixUp: y = scale * conv(x, w)):
//   wgrad epilogue:  G = sum over split-K slices of the wgrad partial sums (or cuDNN's dw)
//                    dw = scale * G (in the weight's type: what autograd needs for it)
//                    and <w, G> (the last block adds the blocks' sums: common/grid_sum.cuh)
//                    (d scale = <w, G>: sum(dy * conv(x, w)) without recomputing the conv)
//   scaled copy:     round(scale * t) of the weight or dy, for cuDNN's dgrad (it takes no alpha)
// One pass each over weight-sized tensors, float math; the dot product's block sums added
// in a fixed order (no floating-point atomics: results do not depend on scheduling).  No torch here: conv2d_backward_cuda.cpp launches.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace cutlass_ops {
namespace conv2d_backward {

enum class Elem { kF32, kF16, kBF16 };

struct WgradEpilogueArgs {
  void const* g;            // [slices][n] partial sums, element type g_type
  Elem g_type;
  int slices;
  int64_t n;                // elements of one slice (= of the weight)
  void const* weight;       // [n] in the same (KRSC) order, element type w_type
  Elem w_type;
  float const* scale;       // device scalar, or null (1)
  void* dw;                 // [n] in w_type, rounded once from float
  float* partial_dots;      // [blocks] per-block sums of w * G
  unsigned* counter;        // one word of scratch (the launcher zeroes it)
  float* dot;               // [1]: <w, G>, added by the last block
};

// Blocks a launch for n elements uses (the partial_dots entries to allocate).
int weight_grad_blocks(int64_t n, int num_sms);

cudaError_t launch_wgrad_epilogue(WgradEpilogueArgs const& a, int blocks, cudaStream_t stream);

// out[i] = round(float(w[i]) * *scale) in w's type (fp16/bf16).
cudaError_t launch_scaled_copy(void const* w, Elem type, int64_t n, float const* scale, void* out,
                               int blocks, cudaStream_t stream);

}  // namespace conv2d_backward
}  // namespace cutlass_ops
