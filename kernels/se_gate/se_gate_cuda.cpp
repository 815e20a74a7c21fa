// CUDA implementations of cutlass_ops::se_gate, se_squeeze and se_gate_apply (one kernel,
// se_gate_kernel.cu) and se_gate_backward (se_gate_backward_kernel.cu).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <vector>

#include "common/cuda_device.h"
#include "common/stream_order.h"
#include "common/torch_stable.h"
#include "se_gate/se_gate_backward_kernel.h"
#include "se_gate/se_gate_kernel.h"
#include "se_gate/se_gate_op.h"

namespace cutlass_ops {
namespace se_gate {

namespace {
bool aligned16(Tensor const& t) { return reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 16 == 0; }
// float32, contiguous, 16-byte aligned (the kernel reads the weights as float4).
Tensor as_float(Tensor const& t) {
  Tensor f = torch::stable::contiguous(to_dtype(t, kFloat));
  return aligned16(f) ? f : torch::stable::clone(f);
}

// This thread's side stream on device `dev` (what c10::cuda::getStreamFromPool gave):
// non-blocking, created on first use and kept (never destroyed).  Per thread, so a graph
// capture on one thread never sees another thread's launches on it.  Its first use is under
// capture (see se_gate_backward_cuda), so it is created in relaxed capture mode, which lets
// a capture in global mode tolerate the call.
cudaStream_t side_stream(int dev) {
  thread_local std::vector<cudaStream_t> streams;
  if (static_cast<size_t>(dev) >= streams.size()) streams.resize(static_cast<size_t>(dev) + 1, nullptr);
  if (streams[dev] == nullptr) {
    DeviceGuard guard(dev);
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    CUTLASS_OPS_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    cudaStream_t stream = nullptr;
    cudaError_t const err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    CUTLASS_OPS_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));  // back to the caller's mode
    CUTLASS_OPS_CUDA_CHECK(err);
    streams[dev] = stream;
  }
  return streams[dev];
}

// Whether the kernel caches the CTA's maps in shared memory: where se_gate_shape says it
// pays, unless CUTLASS_OPS_SE_CACHE (read per call) says 0 (never: the kernel's earlier form)
// or 1 (wherever it fits: for tests and measurements).
bool cache_maps(SeGateShape const& shape) {
  char const* env = std::getenv("CUTLASS_OPS_SE_CACHE");
  if (env == nullptr || env[0] == '\0') return shape.cache_maps;
  return env[0] == '1' && shape.cache_fits;
}

// The maps one se_gate kernel launch reads and writes (undefined where unused).
struct GateMaps {
  Tensor h, identity, out, pooled;  // NHWC, h's dtype
  Tensor means, gate_in;            // (N, C), h's dtype: se_squeeze's result, se_gate_apply's input
};

// Launches the kernel over the N images of m.h, with `a` holding all but N and the maps'
// pointers.  The kernel indexes in 32 bits, and the op is per image: over 2^31 elements it
// runs on chunks of whole images, each under 2^31 (one launch in the usual case).
void launch_in_chunks(SeGateArgs a, GateMaps const& m, char const* op) {
  int const dev = m.h.get_device_index();
  int64_t const N = m.h.size(0), C = m.h.size(1), image = C * m.h.size(2) * m.h.size(3);
  int64_t const chunk = (int64_t(INT32_MAX) - 1) / image;
  int64_t const pooled_image = m.pooled.defined() ? m.pooled.numel() / N : 0;
  int64_t const bytes = m.h.element_size();
  // Byte address of image n0 of map t (null for an unused map).
  auto at = [&](Tensor const& t, int64_t n0, int64_t per_image) -> char* {
    return t.defined() ? static_cast<char*>(t.data_ptr()) + n0 * per_image * bytes : nullptr;
  };
  a.dtype = m.h.scalar_type() == kHalf ? DType::kF16 : DType::kBF16;
  a.H = m.h.size(2); a.W = m.h.size(3); a.C = C;
  a.programmatic_launch = programmatic_launch_allowed(dev);
  bool const excite_here = !m.means.defined() && !m.gate_in.defined();
  for (int64_t n0 = 0; n0 < N; n0 += chunk) {
    a.N = static_cast<int>(std::min(chunk, N - n0));
    a.h = at(m.h, n0, image); a.identity = at(m.identity, n0, image); a.out = at(m.out, n0, image);
    a.pooled = at(m.pooled, n0, pooled_image);
    a.means_out = at(m.means, n0, C); a.gate_in = at(m.gate_in, n0, C);
    SeGateShape shape = se_gate_shape(a.N, a.H, a.W, a.C, a.R, multiprocessor_count(dev),
                                      device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
                                      device_attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev),
                                      device_attribute(cudaDevAttrL2CacheSize, dev));
    a.stage_w2 = excite_here && shape.stage_w2;  // W2 is only read by the excite
    a.cache_maps = !m.means.defined() && cache_maps(shape);  // (se_squeeze reads h once anyway)
    cudaError_t err = launch_se_gate(a, shape.images_per_cta, current_cuda_stream(dev));
    CUTLASS_OPS_CHECK(err == cudaSuccess, op, ": kernel launch failed: ", cudaGetErrorString(err));
  }
}

// Whether the kernel takes h (and the maps of its shape): fp16/bf16, C % 8 == 0 and within
// the kernel's limit, 16-byte aligned, images under 2^31 elements.
bool kernel_fits(Tensor const& hc, std::initializer_list<Tensor const*> others) {
  auto const dtype = hc.scalar_type();
  int64_t const C = hc.size(1), image = C * hc.size(2) * hc.size(3);
  bool fits = (dtype == kHalf || dtype == kBFloat16) && C % 8 == 0 && C <= se_gate_max_channels() &&
              aligned16(hc) && image < INT32_MAX;
  for (Tensor const* t : others) fits = fits && aligned16(*t);
  return fits;
}

Tensor scalar_or_undefined(std::optional<Tensor> const& s) { return s ? as_float(*s) : Tensor(); }
float const* ptr_or_null(Tensor& t) { return t.defined() ? t.mutable_data_ptr<float>() : nullptr; }
}  // namespace

std::tuple<Tensor, Tensor> se_gate_cuda(
    Tensor const& h, Tensor const& identity, Tensor const& w1, Tensor const& b1,
    Tensor const& w2, Tensor const& b2, std::optional<Tensor> const& identity_bias,
    std::optional<Tensor> const& post_bias, bool avgpool, std::optional<Tensor> const& h_bias) {
  check_inputs(h, identity, w1, b1, w2, b2, identity_bias, post_bias, h_bias);
  auto dtype = h.scalar_type();
  Tensor hc = torch::stable::contiguous(h, kChannelsLast);
  Tensor ic = torch::stable::contiguous(identity, kChannelsLast);
  if (!kernel_fits(hc, {&ic})) {
    return se_gate_aten(h, identity, w1, b1, w2, b2, identity_bias, post_bias, avgpool, h_bias);
  }
  DeviceGuard guard(h.get_device_index());
  auto out = empty(h.sizes(), dtype, h.device(), kChannelsLast);
  auto pooled = avgpool ? empty(pooled_shape(h), dtype, h.device(), kChannelsLast) : empty({0}, dtype, h.device());
  if (out.numel() == 0) return {out, pooled};
  Tensor w1f = as_float(w1), b1f = as_float(b1), w2f = as_float(w2), b2f = as_float(b2);
  Tensor idb = scalar_or_undefined(identity_bias), pb = scalar_or_undefined(post_bias), hb = scalar_or_undefined(h_bias);
  SeGateArgs a{};
  a.R = w1.size(0);
  a.w1 = w1f.mutable_data_ptr<float>(); a.b1 = b1f.mutable_data_ptr<float>();
  a.w2 = w2f.mutable_data_ptr<float>(); a.b2 = b2f.mutable_data_ptr<float>();
  a.identity_bias = ptr_or_null(idb); a.post_bias = ptr_or_null(pb); a.h_bias = ptr_or_null(hb);
  launch_in_chunks(a, GateMaps{hc, ic, out, avgpool ? pooled : Tensor(), Tensor(), Tensor()}, "se_gate");
  return {out, pooled};
}

Tensor se_squeeze_cuda(Tensor const& h, std::optional<Tensor> const& h_bias) {
  check_squeeze_inputs(h, h_bias);
  Tensor hc = torch::stable::contiguous(h, kChannelsLast);
  if (!kernel_fits(hc, {})) return se_squeeze_aten(h, h_bias);
  DeviceGuard guard(h.get_device_index());
  auto means = empty({h.size(0), h.size(1)}, h.scalar_type(), h.device());
  if (h.numel() == 0) return means;
  Tensor hb = scalar_or_undefined(h_bias);
  SeGateArgs a{};
  a.h_bias = ptr_or_null(hb);
  launch_in_chunks(a, GateMaps{hc, Tensor(), Tensor(), Tensor(), means, Tensor()}, "se_squeeze");
  return means;
}

std::tuple<Tensor, Tensor> se_gate_apply_cuda(
    Tensor const& h, Tensor const& identity, Tensor const& gate, std::optional<Tensor> const& identity_bias,
    std::optional<Tensor> const& post_bias, bool avgpool, std::optional<Tensor> const& h_bias) {
  check_apply_inputs(h, identity, gate, identity_bias, post_bias, h_bias);
  auto dtype = h.scalar_type();
  Tensor hc = torch::stable::contiguous(h, kChannelsLast);
  Tensor ic = torch::stable::contiguous(identity, kChannelsLast);
  Tensor gc = torch::stable::contiguous(to_dtype(gate, dtype));
  if (!kernel_fits(hc, {&ic})) return se_gate_apply_aten(h, identity, gate, identity_bias, post_bias, avgpool, h_bias);
  DeviceGuard guard(h.get_device_index());
  auto out = empty(h.sizes(), dtype, h.device(), kChannelsLast);
  auto pooled = avgpool ? empty(pooled_shape(h), dtype, h.device(), kChannelsLast) : empty({0}, dtype, h.device());
  if (out.numel() == 0) return {out, pooled};
  Tensor idb = scalar_or_undefined(identity_bias), pb = scalar_or_undefined(post_bias), hb = scalar_or_undefined(h_bias);
  SeGateArgs a{};
  a.identity_bias = ptr_or_null(idb); a.post_bias = ptr_or_null(pb); a.h_bias = ptr_or_null(hb);
  launch_in_chunks(a, GateMaps{hc, ic, out, avgpool ? pooled : Tensor(), Tensor(), gc}, "se_gate_apply");
  return {out, pooled};
}

SeGateGrads se_gate_backward_cuda(Tensor const& grad_out, std::optional<Tensor> const& grad_pooled,
                                  Tensor const& h, Tensor const& out, Tensor const& w1,
                                  Tensor const& b1, Tensor const& w2, Tensor const& b2,
                                  std::optional<Tensor> const& post_bias,
                                  std::optional<Tensor> const& h_bias) {
  check_backward_inputs(grad_out, grad_pooled, h, out, w1, b1, w2, b2, post_bias, h_bias);
  auto dtype = h.scalar_type();
  int64_t const C = h.size(1), R = w1.size(0);
  int const dev = h.get_device_index();
  size_t const max_smem = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  auto fallback = [&] {
    return se_gate_backward_aten(grad_out, grad_pooled, h, out, w1, b1, w2, b2, post_bias, h_bias);
  };
  if ((dtype != kHalf && dtype != kBFloat16) || !se_gate_backward_supported(C, R, max_smem) ||
      h.numel() == 0 || h.numel() >= INT32_MAX) {
    return fallback();  // decided before the layout copies below, which it does not need
  }
  auto const cl = kChannelsLast;
  Tensor go = torch::stable::contiguous(grad_out, cl), hc = torch::stable::contiguous(h, cl),
         oc = torch::stable::contiguous(out, cl);
  Tensor gp = grad_pooled ? torch::stable::contiguous(*grad_pooled, cl) : Tensor();
  if (!aligned16(go) || !aligned16(hc) || !aligned16(oc) || (gp.defined() && !aligned16(gp))) return fallback();
  int const num_sms = multiprocessor_count(dev);
  int const images_per_cta = se_gate_backward_images_per_cta(h.size(0), C, R, num_sms, max_smem);
  DeviceGuard guard(h.get_device_index());
  auto grad_h = empty(h.sizes(), dtype, h.device(), cl);
  auto grad_identity = empty(h.sizes(), dtype, h.device(), cl);
  int64_t const N = h.size(0);
  auto f32 = [&](IntArrayRef sizes) { return empty(sizes, kFloat, h.device()); };
  Tensor squeeze = f32({N, C}), hidden = f32({N, R});
  Tensor d_pre1 = f32({N, R}), d_pre2 = f32({N, C}), sums = f32({N, 2});
  Tensor d_gate = f32({N, C}), gate = f32({N, C}), d_squeeze = f32({N, C});
  Tensor w1f = as_float(w1), b1f = as_float(b1), w2f = as_float(w2), b2f = as_float(b2);
  Tensor pb = post_bias ? as_float(*post_bias) : Tensor();
  Tensor hb = h_bias ? as_float(*h_bias) : Tensor();
  // sum(grad_h): the input kernel's per-block sums, then the finished-block count.
  int const input_blocks = se_gate_backward_input_blocks(N, h.size(2), h.size(3), C, num_sms);
  Tensor grad_h_scratch = f32({int64_t(input_blocks) + 1}), grad_h_bias = f32({});

  SeGateBackwardArgs a{};
  a.dtype = dtype == kHalf ? DType::kF16 : DType::kBF16;
  a.N = N; a.H = h.size(2); a.W = h.size(3); a.C = C; a.R = R;
  a.P = gp.defined() ? gp.size(2) : 0; a.Q = gp.defined() ? gp.size(3) : 0;
  a.grad_out = go.data_ptr(); a.grad_pooled = gp.defined() ? gp.data_ptr() : nullptr;
  a.h = hc.data_ptr(); a.out = oc.data_ptr();
  a.w1 = w1f.mutable_data_ptr<float>(); a.b1 = b1f.mutable_data_ptr<float>();
  a.w2 = w2f.mutable_data_ptr<float>(); a.b2 = b2f.mutable_data_ptr<float>();
  a.post_bias = pb.defined() ? pb.mutable_data_ptr<float>() : nullptr;
  a.h_bias = hb.defined() ? hb.mutable_data_ptr<float>() : nullptr;
  a.grad_h_partials = grad_h_scratch.mutable_data_ptr<float>();
  a.grad_h_counter = reinterpret_cast<unsigned*>(grad_h_scratch.mutable_data_ptr<float>() + input_blocks);
  a.grad_h_sum = grad_h_bias.mutable_data_ptr<float>();
  a.grad_y = grad_identity.data_ptr(); a.grad_h = grad_h.data_ptr();
  a.squeeze = squeeze.mutable_data_ptr<float>(); a.hidden = hidden.mutable_data_ptr<float>();
  a.d_pre1 = d_pre1.mutable_data_ptr<float>(); a.d_pre2 = d_pre2.mutable_data_ptr<float>();
  a.sums = sums.mutable_data_ptr<float>();
  a.d_gate = d_gate.mutable_data_ptr<float>(); a.gate = gate.mutable_data_ptr<float>();
  a.d_squeeze = d_squeeze.mutable_data_ptr<float>();
  a.programmatic_launch = programmatic_launch_allowed(dev);
  cudaStream_t const stream = current_cuda_stream(dev);
  cudaError_t err = launch_se_gate_backward_per_image(a, images_per_cta, stream);
  CUTLASS_OPS_CHECK(err == cudaSuccess, "se_gate_backward: kernel launch failed: ", cudaGetErrorString(err));
  // The batch reductions over the per-image vectors (two kernels).
  auto grad_w1 = f32({R, C}), grad_b1 = f32({R});
  auto grad_w2 = f32({C, R}), grad_b2 = f32({C});
  auto grad_identity_bias = f32({}), grad_post_bias = f32({});
  int const chunks = se_param_grad_chunks(N, C, R);
  auto partials = f32({int64_t(chunks), int64_t(se_param_grad_entries(C, R))});
  SeParamGradArgs p{int(N), int(C), int(R), squeeze.mutable_data_ptr<float>(), hidden.mutable_data_ptr<float>(),
                    d_pre1.mutable_data_ptr<float>(), d_pre2.mutable_data_ptr<float>(), sums.mutable_data_ptr<float>(),
                    partials.mutable_data_ptr<float>(), grad_w1.mutable_data_ptr<float>(),
                    grad_b1.mutable_data_ptr<float>(), grad_w2.mutable_data_ptr<float>(),
                    grad_b2.mutable_data_ptr<float>(), grad_identity_bias.mutable_data_ptr<float>(),
                    grad_post_bias.mutable_data_ptr<float>()};
  // While a CUDA graph is captured, the batch sums run on a side stream beside the grad_h
  // pass (alone, the sums' few CTAs leave most of the GPU idle), joined before returning;
  // every tensor they touch was allocated before the fork and is freed after the join.
  // Eager calls stay on one stream: there the fork costs more host time than it saves.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  CUTLASS_OPS_CHECK(cudaStreamIsCapturing(stream, &capture) == cudaSuccess,
                    "se_gate_backward: cudaStreamIsCapturing failed");
  bool const fork = capture == cudaStreamCaptureStatusActive;
  cudaStream_t const sums_stream = fork ? side_stream(dev) : stream;
  if (fork) stream_wait_for(sums_stream, stream);
  err = launch_se_gate_param_grads(p, chunks, sums_stream);
  CUTLASS_OPS_CHECK(err == cudaSuccess, "se_gate_backward: kernel launch failed: ", cudaGetErrorString(err));
  err = launch_se_gate_backward_input(a, num_sms, stream);
  CUTLASS_OPS_CHECK(err == cudaSuccess, "se_gate_backward: kernel launch failed: ", cudaGetErrorString(err));
  if (fork) stream_wait_for(stream, sums_stream);
  return {grad_h, grad_identity, grad_w1, grad_b1, grad_w2, grad_b2, grad_identity_bias, grad_post_bias, grad_h_bias};
}

}  // namespace se_gate
}  // namespace cutlass_ops

STABLE_TORCH_LIBRARY_IMPL(cutlass_ops, CUDA, m) {
  m.impl("se_gate", TORCH_BOX(&cutlass_ops::se_gate::se_gate_cuda));
  m.impl("se_gate_backward", TORCH_BOX(&cutlass_ops::se_gate::se_gate_backward_cuda));
  m.impl("se_squeeze", TORCH_BOX(&cutlass_ops::se_gate::se_squeeze_cuda));
  m.impl("se_gate_apply", TORCH_BOX(&cutlass_ops::se_gate::se_gate_apply_cuda));
}
