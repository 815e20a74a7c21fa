// CUDA implementations of cutlass_ops::giou_loss and giou_loss_backward (kernels in
// giou_kernel.cu): one kernel (+ a one-block reduction) forward, one kernel backward, on the
// current stream, no host sync.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "giou/giou_kernel.h"
#include "giou/giou_op.h"

namespace cutlass_ops {
namespace giou {

namespace {

// The kernel's view of the inputs, and the contiguous tensors it points into.
struct Operands {
  at::Tensor boxes1, boxes2, mask, counts, offsets;
  GiouInputs in{};
};

Operands operands(at::Tensor const& boxes1, at::Tensor const& boxes2, std::optional<at::Tensor> const& mask,
                  std::optional<at::Tensor> const& counts, std::optional<at::Tensor> const& offsets,
                  LossReduction reduction, double eps) {
  Operands o;
  o.boxes1 = boxes1.contiguous();
  o.boxes2 = boxes2.contiguous();
  GiouInputs& in = o.in;
  switch (boxes1.scalar_type()) {
    case at::kDouble: in.dtype = DType::kF64; break;
    case at::kHalf: in.dtype = DType::kF16; break;
    case at::kBFloat16: in.dtype = DType::kBF16; break;
    default: in.dtype = DType::kF32; break;
  }
  in.n = boxes1.numel() / 4;
  in.boxes1 = o.boxes1.data_ptr();
  in.boxes2 = o.boxes2.data_ptr();
  in.validity = Validity::kAll;
  if (mask) {
    o.mask = mask->contiguous();
    in.validity = Validity::kMask;
    in.mask = o.mask.data_ptr<bool>();
  }
  if (counts) {
    o.counts = counts->contiguous();
    in.validity = Validity::kCounts;
    in.counts = o.counts.data_ptr<int64_t>();
    in.per_image = boxes1.size(1);
  }
  if (offsets) {
    o.offsets = offsets->contiguous();
    in.validity = Validity::kRange;
    in.offsets = o.offsets.data_ptr<int64_t>();
    in.num_images = offsets->size(0) - 1;
  }
  in.reduction = reduction == LossReduction::kMean  ? Reduction::kMean
                 : reduction == LossReduction::kSum ? Reduction::kSum
                                                    : Reduction::kNone;
  in.eps = eps;
  return o;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> giou_loss_cuda(
    at::Tensor const& boxes1, at::Tensor const& boxes2, std::optional<at::Tensor> const& mask,
    std::optional<at::Tensor> const& counts, std::optional<at::Tensor> const& offsets,
    std::string_view reduction, double eps) {
  auto r = check_inputs(boxes1, boxes2, mask, counts, offsets, reduction);
  c10::cuda::CUDAGuard guard(boxes1.device());
  Operands o = operands(boxes1, boxes2, mask, counts, offsets, r, eps);
  auto math = boxes1.options().dtype(loss_dtype(boxes1.scalar_type()));
  auto index = boxes1.options().dtype(at::kLong);
  at::Tensor loss = r == LossReduction::kNone ? at::empty(boxes1.sizes().slice(0, boxes1.dim() - 1), math)
                                              : at::empty({}, math);
  at::Tensor num_valid = at::empty({}, index);
  int blocks = giou_blocks(o.in.n);
  at::Tensor partial_loss = at::empty({blocks}, math), partial_count = at::empty({blocks}, index);

  GiouForwardArgs a{};
  a.in = o.in;
  a.loss = loss.data_ptr();
  a.num_valid = num_valid.data_ptr<int64_t>();
  a.partial_loss = partial_loss.data_ptr();
  a.partial_count = partial_count.data_ptr<int64_t>();
  cudaError_t err = launch_giou_forward(a, c10::cuda::getCurrentCUDAStream(boxes1.device().index()).stream());
  TORCH_CHECK(err == cudaSuccess, "giou_loss: kernel launch failed: ", cudaGetErrorString(err));
  return {loss, num_valid};
}

std::tuple<at::Tensor, at::Tensor> giou_loss_backward_cuda(
    at::Tensor const& grad_loss, at::Tensor const& boxes1, at::Tensor const& boxes2,
    std::optional<at::Tensor> const& mask, std::optional<at::Tensor> const& counts,
    std::optional<at::Tensor> const& offsets, at::Tensor const& num_valid,
    std::string_view reduction, double eps) {
  auto r = check_inputs(boxes1, boxes2, mask, counts, offsets, reduction);
  check_backward_inputs(grad_loss, boxes1, num_valid, r);
  c10::cuda::CUDAGuard guard(boxes1.device());
  Operands o = operands(boxes1, boxes2, mask, counts, offsets, r, eps);
  at::Tensor grad = grad_loss.to(loss_dtype(boxes1.scalar_type())).contiguous();
  at::Tensor grad1 = at::empty(boxes1.sizes(), boxes1.options());
  at::Tensor grad2 = at::empty(boxes2.sizes(), boxes2.options());

  GiouBackwardArgs a{};
  a.in = o.in;
  a.grad_loss = grad.data_ptr();
  a.num_valid = num_valid.data_ptr<int64_t>();
  a.grad1 = grad1.data_ptr();
  a.grad2 = grad2.data_ptr();
  cudaError_t err = launch_giou_backward(a, c10::cuda::getCurrentCUDAStream(boxes1.device().index()).stream());
  TORCH_CHECK(err == cudaSuccess, "giou_loss_backward: kernel launch failed: ", cudaGetErrorString(err));
  return {grad1, grad2};
}

}  // namespace giou
}  // namespace cutlass_ops

TORCH_LIBRARY_IMPL(cutlass_ops, CUDA, m) {
  m.impl("giou_loss", &cutlass_ops::giou::giou_loss_cuda);
  m.impl("giou_loss_backward", &cutlass_ops::giou::giou_loss_backward_cuda);
}
