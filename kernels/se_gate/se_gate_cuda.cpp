// CUDA implementations of cutlass_ops::se_gate (kernel in se_gate_kernel.cu) and
// se_gate_backward (se_gate_backward_kernel.cu).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>

#include "common/cuda_device.h"
#include "common/stream_order.h"
#include "se_gate/se_gate_backward_kernel.h"
#include "se_gate/se_gate_kernel.h"
#include "se_gate/se_gate_op.h"

namespace cutlass_ops {
namespace se_gate {

namespace {
bool aligned16(at::Tensor const& t) { return reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 16 == 0; }
// float32, contiguous, 16-byte aligned (the kernel reads the weights as float4).
at::Tensor as_float(at::Tensor const& t) {
  at::Tensor f = t.to(at::kFloat).contiguous();
  return aligned16(f) ? f : f.clone();
}
}  // namespace

std::tuple<at::Tensor, at::Tensor> se_gate_cuda(
    at::Tensor const& h, at::Tensor const& identity, at::Tensor const& w1, at::Tensor const& b1,
    at::Tensor const& w2, at::Tensor const& b2, c10::optional<at::Tensor> const& identity_bias,
    c10::optional<at::Tensor> const& post_bias, bool avgpool, c10::optional<at::Tensor> const& h_bias) {
  check_inputs(h, identity, w1, b1, w2, b2, identity_bias, post_bias, h_bias);
  auto dtype = h.scalar_type();
  int64_t C = h.size(1), R = w1.size(0);
  at::Tensor hc = h.contiguous(at::MemoryFormat::ChannelsLast);
  at::Tensor ic = identity.contiguous(at::MemoryFormat::ChannelsLast);
  int64_t const image = C * h.size(2) * h.size(3);  // elements per image
  bool kernel_fits = (dtype == at::kHalf || dtype == at::kBFloat16) && C % 8 == 0 && C <= se_gate_max_channels() &&
                     aligned16(hc) && aligned16(ic) && image < INT32_MAX;
  if (!kernel_fits) {
    return se_gate_aten(h, identity, w1, b1, w2, b2, identity_bias, post_bias, avgpool, h_bias);
  }
  c10::cuda::CUDAGuard guard(h.device());
  auto cl = h.options().memory_format(at::MemoryFormat::ChannelsLast);
  auto out = at::empty(h.sizes(), cl);
  auto pooled = avgpool ? at::empty(pooled_shape(h), cl) : at::empty({0}, h.options());
  if (out.numel() == 0) return {out, pooled};
  at::Tensor w1f = as_float(w1), b1f = as_float(b1), w2f = as_float(w2), b2f = as_float(b2);
  at::Tensor idb = identity_bias ? as_float(*identity_bias) : at::Tensor();
  at::Tensor pb = post_bias ? as_float(*post_bias) : at::Tensor();
  at::Tensor hb = h_bias ? as_float(*h_bias) : at::Tensor();

  SeGateArgs a{};
  a.dtype = dtype == at::kHalf ? DType::kF16 : DType::kBF16;
  a.H = h.size(2); a.W = h.size(3); a.C = C; a.R = R;
  a.w1 = w1f.data_ptr<float>(); a.b1 = b1f.data_ptr<float>();
  a.w2 = w2f.data_ptr<float>(); a.b2 = b2f.data_ptr<float>();
  a.identity_bias = idb.defined() ? idb.data_ptr<float>() : nullptr;
  a.post_bias = pb.defined() ? pb.data_ptr<float>() : nullptr;
  a.h_bias = hb.defined() ? hb.data_ptr<float>() : nullptr;
  int dev = h.device().index();
  a.programmatic_launch = programmatic_launch_allowed(dev);
  // The kernel indexes in 32 bits, and the op is per image: over 2^31 elements it runs on
  // chunks of whole images, each under 2^31 (one launch in the usual case).
  int64_t const N = h.size(0), chunk = (int64_t(INT32_MAX) - 1) / image;
  int64_t const pooled_image = avgpool ? pooled.numel() / N : 0;
  auto* h0 = static_cast<char const*>(hc.data_ptr());
  auto* i0 = static_cast<char const*>(ic.data_ptr());
  auto* o0 = static_cast<char*>(out.data_ptr());
  int64_t const bytes = h.element_size();
  for (int64_t n0 = 0; n0 < N; n0 += chunk) {
    a.N = static_cast<int>(std::min(chunk, N - n0));
    a.h = h0 + n0 * image * bytes; a.identity = i0 + n0 * image * bytes; a.out = o0 + n0 * image * bytes;
    a.pooled = avgpool ? static_cast<char*>(pooled.data_ptr()) + n0 * pooled_image * bytes : nullptr;
    SeGateShape shape = se_gate_shape(a.N, a.H, a.W, a.C, a.R, multiprocessor_count(dev),
                                      device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    a.stage_w2 = shape.stage_w2;
    cudaError_t err = launch_se_gate(a, shape.images_per_cta, c10::cuda::getCurrentCUDAStream(dev).stream());
    TORCH_CHECK(err == cudaSuccess, "se_gate: kernel launch failed: ", cudaGetErrorString(err));
  }
  return {out, pooled};
}

SeGateGrads se_gate_backward_cuda(at::Tensor const& grad_out, c10::optional<at::Tensor> const& grad_pooled,
                                  at::Tensor const& h, at::Tensor const& out, at::Tensor const& w1,
                                  at::Tensor const& b1, at::Tensor const& w2, at::Tensor const& b2,
                                  c10::optional<at::Tensor> const& post_bias,
                                  c10::optional<at::Tensor> const& h_bias) {
  check_backward_inputs(grad_out, grad_pooled, h, out, w1, b1, w2, b2, post_bias, h_bias);
  auto dtype = h.scalar_type();
  int64_t const C = h.size(1), R = w1.size(0);
  int const dev = h.device().index();
  size_t const max_smem = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  auto fallback = [&] {
    return se_gate_backward_aten(grad_out, grad_pooled, h, out, w1, b1, w2, b2, post_bias, h_bias);
  };
  if ((dtype != at::kHalf && dtype != at::kBFloat16) || !se_gate_backward_supported(C, R, max_smem) ||
      h.numel() == 0 || h.numel() >= INT32_MAX) {
    return fallback();  // decided before the layout copies below, which it does not need
  }
  auto const cl = at::MemoryFormat::ChannelsLast;
  at::Tensor go = grad_out.contiguous(cl), hc = h.contiguous(cl), oc = out.contiguous(cl);
  at::Tensor gp = grad_pooled ? grad_pooled->contiguous(cl) : at::Tensor();
  if (!aligned16(go) || !aligned16(hc) || !aligned16(oc) || (gp.defined() && !aligned16(gp))) return fallback();
  int const num_sms = multiprocessor_count(dev);
  int const images_per_cta = se_gate_backward_images_per_cta(h.size(0), C, R, num_sms, max_smem);
  c10::cuda::CUDAGuard guard(h.device());
  auto grad_h = at::empty(h.sizes(), h.options().memory_format(cl));
  auto grad_identity = at::empty(h.sizes(), h.options().memory_format(cl));
  int64_t const N = h.size(0);
  auto f32 = h.options().dtype(at::kFloat);
  at::Tensor squeeze = at::empty({N, C}, f32), hidden = at::empty({N, R}, f32);
  at::Tensor d_pre1 = at::empty({N, R}, f32), d_pre2 = at::empty({N, C}, f32), sums = at::empty({N, 2}, f32);
  at::Tensor d_gate = at::empty({N, C}, f32), gate = at::empty({N, C}, f32), d_squeeze = at::empty({N, C}, f32);
  at::Tensor w1f = as_float(w1), b1f = as_float(b1), w2f = as_float(w2), b2f = as_float(b2);
  at::Tensor pb = post_bias ? as_float(*post_bias) : at::Tensor();
  at::Tensor hb = h_bias ? as_float(*h_bias) : at::Tensor();
  // sum(grad_h): the input kernel's per-block sums, then the finished-block count.
  int const input_blocks = se_gate_backward_input_blocks(N, h.size(2), h.size(3), C, num_sms);
  at::Tensor grad_h_scratch = at::empty({input_blocks + 1}, f32), grad_h_bias = at::empty({}, f32);

  SeGateBackwardArgs a{};
  a.dtype = dtype == at::kHalf ? DType::kF16 : DType::kBF16;
  a.N = N; a.H = h.size(2); a.W = h.size(3); a.C = C; a.R = R;
  a.P = gp.defined() ? gp.size(2) : 0; a.Q = gp.defined() ? gp.size(3) : 0;
  a.grad_out = go.data_ptr(); a.grad_pooled = gp.defined() ? gp.data_ptr() : nullptr;
  a.h = hc.data_ptr(); a.out = oc.data_ptr();
  a.w1 = w1f.data_ptr<float>(); a.b1 = b1f.data_ptr<float>();
  a.w2 = w2f.data_ptr<float>(); a.b2 = b2f.data_ptr<float>();
  a.post_bias = pb.defined() ? pb.data_ptr<float>() : nullptr;
  a.h_bias = hb.defined() ? hb.data_ptr<float>() : nullptr;
  a.grad_h_partials = grad_h_scratch.data_ptr<float>();
  a.grad_h_counter = reinterpret_cast<unsigned*>(grad_h_scratch.data_ptr<float>() + input_blocks);
  a.grad_h_sum = grad_h_bias.data_ptr<float>();
  a.grad_y = grad_identity.data_ptr(); a.grad_h = grad_h.data_ptr();
  a.squeeze = squeeze.data_ptr<float>(); a.hidden = hidden.data_ptr<float>();
  a.d_pre1 = d_pre1.data_ptr<float>(); a.d_pre2 = d_pre2.data_ptr<float>(); a.sums = sums.data_ptr<float>();
  a.d_gate = d_gate.data_ptr<float>(); a.gate = gate.data_ptr<float>(); a.d_squeeze = d_squeeze.data_ptr<float>();
  a.programmatic_launch = programmatic_launch_allowed(dev);
  c10::cuda::CUDAStream const stream = c10::cuda::getCurrentCUDAStream(dev);
  cudaError_t err = launch_se_gate_backward_per_image(a, images_per_cta, stream.stream());
  TORCH_CHECK(err == cudaSuccess, "se_gate_backward: kernel launch failed: ", cudaGetErrorString(err));
  // The batch reductions over the per-image vectors (two kernels).
  auto grad_w1 = at::empty({R, C}, f32), grad_b1 = at::empty({R}, f32);
  auto grad_w2 = at::empty({C, R}, f32), grad_b2 = at::empty({C}, f32);
  auto grad_identity_bias = at::empty({}, f32), grad_post_bias = at::empty({}, f32);
  int const chunks = se_param_grad_chunks(N, C, R);
  auto partials = at::empty({chunks, se_param_grad_entries(C, R)}, f32);
  SeParamGradArgs p{int(N), int(C), int(R), squeeze.data_ptr<float>(), hidden.data_ptr<float>(),
                    d_pre1.data_ptr<float>(), d_pre2.data_ptr<float>(), sums.data_ptr<float>(),
                    partials.data_ptr<float>(), grad_w1.data_ptr<float>(), grad_b1.data_ptr<float>(),
                    grad_w2.data_ptr<float>(), grad_b2.data_ptr<float>(), grad_identity_bias.data_ptr<float>(),
                    grad_post_bias.data_ptr<float>()};
  // While a CUDA graph is captured, the batch sums run on a side stream beside the grad_h
  // pass (alone, the sums' few CTAs leave most of the GPU idle), joined before returning;
  // every tensor they touch was allocated before the fork and is freed after the join.
  // Eager calls stay on one stream: there the fork costs more host time than it saves.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  TORCH_CHECK(cudaStreamIsCapturing(stream.stream(), &capture) == cudaSuccess,
              "se_gate_backward: cudaStreamIsCapturing failed");
  bool const fork = capture == cudaStreamCaptureStatusActive;
  c10::cuda::CUDAStream const sums_stream = fork ? c10::cuda::getStreamFromPool(false, dev) : stream;
  if (fork) stream_wait_for(sums_stream.stream(), stream.stream());
  err = launch_se_gate_param_grads(p, chunks, sums_stream.stream());
  TORCH_CHECK(err == cudaSuccess, "se_gate_backward: kernel launch failed: ", cudaGetErrorString(err));
  err = launch_se_gate_backward_input(a, num_sms, stream.stream());
  TORCH_CHECK(err == cudaSuccess, "se_gate_backward: kernel launch failed: ", cudaGetErrorString(err));
  if (fork) stream_wait_for(stream.stream(), sums_stream.stream());
  return {grad_h, grad_identity, grad_w1, grad_b1, grad_w2, grad_b2, grad_identity_bias, grad_post_bias, grad_h_bias};
}

}  // namespace se_gate
}  // namespace cutlass_ops

TORCH_LIBRARY_IMPL(cutlass_ops, CUDA, m) {
  m.impl("se_gate", &cutlass_ops::se_gate::se_gate_cuda);
  m.impl("se_gate_backward", &cutlass_ops::se_gate::se_gate_backward_cuda);
}
