// Generalized-IoU loss of box pairs, forward and backward, one thread per box slot:
//   loss = 1 - (inter / (union + eps) - (enclose - union) / (enclose + eps))
// exactly torchvision.ops.generalized_box_iou_loss (xyxy boxes, the intersection counts only
// where both of its sides are > 0, torch.maximum/minimum's half-and-half gradient at ties).
// Boxes: contiguous [n, 4] of T = float/double/half/bfloat16; math in float (double for
// double inputs); loss and grad_loss in that math type, box gradients in T.
// Invalid slots (see Validity) are never read: loss 0, gradient 0, not counted.
// No torch here: the op entry point (giou_cuda.cpp) calls the launchers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace cutlass_ops {
namespace giou {

enum class DType { kF32, kF64, kF16, kBF16 };
enum class Reduction { kNone, kMean, kSum };

// Which box slots are valid.
enum class Validity {
  kAll,     // every slot
  kMask,    // mask[i]
  kCounts,  // padded (B, per_image): i % per_image < counts[i / per_image]
  kRange,   // ragged: offsets[0] <= i < offsets[num_images]
};

struct GiouInputs {
  DType dtype;
  int64_t n;  // box slots
  void const* boxes1;
  void const* boxes2;
  Validity validity;
  bool const* mask;
  int64_t const* counts;
  int64_t per_image;
  int64_t const* offsets;
  int64_t num_images;
  Reduction reduction;
  double eps;
};

struct GiouForwardArgs {
  GiouInputs in;
  void* loss;          // kNone: [n]; else a scalar (mean over the valid slots, or their sum)
  int64_t* num_valid;  // scalar
  // Workspace: one loss sum and one valid count per block (giou_blocks(n) of each); summed
  // in a fixed order by a second, one-block kernel, so results are deterministic.
  void* partial_loss;
  int64_t* partial_count;
};

struct GiouBackwardArgs {
  GiouInputs in;
  void const* grad_loss;     // kNone: [n]; else a scalar
  int64_t const* num_valid;  // the forward's count (kMean divides by max(it, 1))
  void* grad1;               // [n, 4] in T, zeros at invalid slots
  void* grad2;
};

// Blocks the launchers use for n slots (the size of the forward's workspace).
int giou_blocks(int64_t n);

// Both return the launch's cudaError.  n == 0 is fine (outputs: 0 loss, 0 count).
cudaError_t launch_giou_forward(GiouForwardArgs const& a, cudaStream_t stream);
cudaError_t launch_giou_backward(GiouBackwardArgs const& a, cudaStream_t stream);

}  // namespace giou
}  // namespace cutlass_ops
