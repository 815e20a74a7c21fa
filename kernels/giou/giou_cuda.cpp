// CUDA implementations of cutlass_ops::giou_loss and giou_loss_backward (kernels in
// giou_kernel.cu): one kernel (+ a one-block reduction) forward, one kernel backward, on the
// current stream, no host sync.
#include "common/torch_stable.h"
#include "giou/giou_kernel.h"
#include "giou/giou_op.h"

namespace cutlass_ops {
namespace giou {

namespace {

// The kernel's view of the inputs, and the contiguous tensors it points into.
struct Operands {
  Tensor boxes1, boxes2, mask, counts, offsets;
  GiouInputs in{};
};

Operands operands(Tensor const& boxes1, Tensor const& boxes2, std::optional<Tensor> const& mask,
                  std::optional<Tensor> const& counts, std::optional<Tensor> const& offsets,
                  LossReduction reduction, double eps) {
  Operands o;
  o.boxes1 = torch::stable::contiguous(boxes1);
  o.boxes2 = torch::stable::contiguous(boxes2);
  GiouInputs& in = o.in;
  switch (boxes1.scalar_type()) {
    case kDouble: in.dtype = DType::kF64; break;
    case kHalf: in.dtype = DType::kF16; break;
    case kBFloat16: in.dtype = DType::kBF16; break;
    default: in.dtype = DType::kF32; break;
  }
  in.n = boxes1.numel() / 4;
  in.boxes1 = o.boxes1.data_ptr();
  in.boxes2 = o.boxes2.data_ptr();
  in.validity = Validity::kAll;
  if (mask) {
    o.mask = torch::stable::contiguous(*mask);
    in.validity = Validity::kMask;
    in.mask = o.mask.mutable_data_ptr<bool>();
  }
  if (counts) {
    o.counts = torch::stable::contiguous(*counts);
    in.validity = Validity::kCounts;
    in.counts = o.counts.mutable_data_ptr<int64_t>();
    in.per_image = boxes1.size(1);
  }
  if (offsets) {
    o.offsets = torch::stable::contiguous(*offsets);
    in.validity = Validity::kRange;
    in.offsets = o.offsets.mutable_data_ptr<int64_t>();
    in.num_images = offsets->size(0) - 1;
  }
  in.reduction = reduction == LossReduction::kMean  ? Reduction::kMean
                 : reduction == LossReduction::kSum ? Reduction::kSum
                                                    : Reduction::kNone;
  in.eps = eps;
  return o;
}

}  // namespace

std::tuple<Tensor, Tensor> giou_loss_cuda(
    Tensor const& boxes1, Tensor const& boxes2, std::optional<Tensor> const& mask,
    std::optional<Tensor> const& counts, std::optional<Tensor> const& offsets,
    std::string_view reduction, double eps) {
  auto r = check_inputs(boxes1, boxes2, mask, counts, offsets, reduction);
  DeviceGuard guard(boxes1.get_device_index());
  Operands o = operands(boxes1, boxes2, mask, counts, offsets, r, eps);
  auto math = loss_dtype(boxes1.scalar_type());
  Tensor loss = r == LossReduction::kNone ? empty(boxes1.sizes().slice(0, boxes1.dim() - 1), math, boxes1.device())
                                          : empty({}, math, boxes1.device());
  Tensor num_valid = empty({}, kLong, boxes1.device());
  int blocks = giou_blocks(o.in.n);
  Tensor partial_loss = empty({int64_t(blocks)}, math, boxes1.device());
  Tensor partial_count = empty({int64_t(blocks)}, kLong, boxes1.device());

  GiouForwardArgs a{};
  a.in = o.in;
  a.loss = loss.data_ptr();
  a.num_valid = num_valid.mutable_data_ptr<int64_t>();
  a.partial_loss = partial_loss.data_ptr();
  a.partial_count = partial_count.mutable_data_ptr<int64_t>();
  cudaError_t err = launch_giou_forward(a, current_cuda_stream(boxes1.get_device_index()));
  CUTLASS_OPS_CHECK(err == cudaSuccess, "giou_loss: kernel launch failed: ", cudaGetErrorString(err));
  return {loss, num_valid};
}

std::tuple<Tensor, Tensor> giou_loss_backward_cuda(
    Tensor const& grad_loss, Tensor const& boxes1, Tensor const& boxes2,
    std::optional<Tensor> const& mask, std::optional<Tensor> const& counts,
    std::optional<Tensor> const& offsets, Tensor const& num_valid,
    std::string_view reduction, double eps) {
  auto r = check_inputs(boxes1, boxes2, mask, counts, offsets, reduction);
  check_backward_inputs(grad_loss, boxes1, num_valid, r);
  DeviceGuard guard(boxes1.get_device_index());
  Operands o = operands(boxes1, boxes2, mask, counts, offsets, r, eps);
  Tensor grad = torch::stable::contiguous(to_dtype(grad_loss, loss_dtype(boxes1.scalar_type())));
  Tensor grad1 = empty(boxes1.sizes(), boxes1.scalar_type(), boxes1.device());
  Tensor grad2 = empty(boxes2.sizes(), boxes2.scalar_type(), boxes2.device());

  GiouBackwardArgs a{};
  a.in = o.in;
  a.grad_loss = grad.data_ptr();
  a.num_valid = num_valid.mutable_data_ptr<int64_t>();
  a.grad1 = grad1.data_ptr();
  a.grad2 = grad2.data_ptr();
  cudaError_t err = launch_giou_backward(a, current_cuda_stream(boxes1.get_device_index()));
  CUTLASS_OPS_CHECK(err == cudaSuccess, "giou_loss_backward: kernel launch failed: ", cudaGetErrorString(err));
  return {grad1, grad2};
}

}  // namespace giou
}  // namespace cutlass_ops

STABLE_TORCH_LIBRARY_IMPL(cutlass_ops, CUDA, m) {
  m.impl("giou_loss", TORCH_BOX(&cutlass_ops::giou::giou_loss_cuda));
  m.impl("giou_loss_backward", TORCH_BOX(&cutlass_ops::giou::giou_loss_backward_cuda));
}
