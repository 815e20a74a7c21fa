// Proof of concept: a cutlass_ops-style op written only against PyTorch's
// LibTorch stable ABI (torch/csrc/stable + torch/headeronly).  No ATen / c10
// headers are included; compiling with -DTORCH_TARGET_VERSION makes any
// accidental include of a non-stable header a hard #error.
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <atomic>
#include <sstream>
#include <stdexcept>

// TORCH_CHECK_VALUE replacement.  STD_TORCH_CHECK throws std::runtime_error
// (Python RuntimeError); the project's tests expect ValueError, which torch's
// op-call path produces from std::invalid_argument (checked in 2.11 and 2.14.1).
#define CUTLASS_OPS_CHECK_VALUE(cond, ...)                                         \
  do {                                                                             \
    if (!(cond)) {                                                                 \
      std::ostringstream cutlass_ops_msg_;                                         \
      cutlass_ops_msg_ << __VA_ARGS__;                                             \
      throw std::invalid_argument(cutlass_ops_msg_.str());                         \
    }                                                                              \
  } while (0)

// TORCH_WARN_ONCE replacement: aoti_torch_warn (C shim) raises a Python
// UserWarning; the once-ness is a local flag.
#define CUTLASS_OPS_WARN_ONCE(msg)                                                 \
  do {                                                                             \
    static std::atomic<bool> cutlass_ops_warned_{false};                           \
    if (!cutlass_ops_warned_.exchange(true))                                       \
      aoti_torch_warn(__func__, __FILE__, static_cast<uint32_t>(__LINE__), (msg)); \
  } while (0)

using torch::stable::Tensor;
using torch::headeronly::ScalarType;

namespace cutlass_ops_stable {

// grad * (out > 0), the same contract as cutlass_ops::relu_backward, but on
// CPU and float32 only: the point is the binding, not the kernel.
Tensor relu_backward(Tensor grad, Tensor out) {
  STD_TORCH_CHECK(grad.is_cpu() && out.is_cpu(), "relu_backward: CPU tensors only in this PoC");
  CUTLASS_OPS_CHECK_VALUE(grad.scalar_type() == ScalarType::Float &&
                              out.scalar_type() == ScalarType::Float,
                          "relu_backward: expected float32, got " << grad.scalar_type());
  STD_TORCH_CHECK(grad.dim() == out.dim(), "relu_backward: rank mismatch");
  for (int64_t d = 0; d < grad.dim(); ++d) {
    STD_TORCH_CHECK(grad.size(d) == out.size(d), "relu_backward: shape mismatch at dim ", d);
  }
  // .contiguous() is a dispatcher call (aten::contiguous) in torch::stable.
  Tensor g = torch::stable::contiguous(grad);
  Tensor o = torch::stable::contiguous(out);
  Tensor result = torch::stable::empty_like(g);  // also dispatcher-backed
  const float* gp = g.const_data_ptr<float>();
  const float* op = o.const_data_ptr<float>();
  float* rp = result.mutable_data_ptr<float>();
  const int64_t n = g.numel();
  for (int64_t i = 0; i < n; ++i) rp[i] = op[i] > 0.f ? gp[i] : 0.f;
  return result;
}

// The project's ATen fallbacks (at::convolution, at::convolution_backward,
// at::where, at::linear, ...) have no typed wrapper in torch::stable 2.11.
// They can still be reached by name through the boxed dispatcher:
// torch_call_dispatcher("aten::convolution", "", stack, TORCH_ABI_VERSION).
Tensor conv2d_fallback(Tensor x, Tensor w, std::optional<Tensor> bias,
                       int64_t stride, int64_t padding) {
  namespace d = torch::stable::detail;
  std::vector<int64_t> s{stride, stride}, p{padding, padding}, dil{1, 1}, op{0, 0};
  std::array<StableIValue, 9> stack{
      d::from(x), d::from(w), d::from(bias), d::from(s), d::from(p),
      d::from(dil), d::from(false), d::from(op), d::from(int64_t{1})};
  TORCH_ERROR_CODE_CHECK(torch_call_dispatcher("aten::convolution", "", stack.data(),
                                               TORCH_ABI_VERSION));
  return d::to<Tensor>(stack[0]);
}

// Multi-output + bool[3] argument through the dispatcher: the conv2d_backward
// family's at::convolution_backward fallback.
std::tuple<Tensor, Tensor, Tensor> conv2d_backward_fallback(Tensor grad_out, Tensor x, Tensor w,
                                                            int64_t stride, int64_t padding) {
  namespace d = torch::stable::detail;
  std::vector<int64_t> bias_sizes{w.size(0)};
  std::vector<int64_t> s{stride, stride}, p{padding, padding}, dil{1, 1}, op{0, 0};
  // std::vector<bool> is rejected (bitfield); a bool array through
  // HeaderOnlyArrayRef<bool> becomes a List[bool] on the libtorch side.
  const bool mask_data[3] = {true, true, true};
  torch::headeronly::HeaderOnlyArrayRef<bool> mask(mask_data, 3);
  std::array<StableIValue, 11> stack{
      d::from(grad_out), d::from(x), d::from(w),
      d::from(std::optional<std::vector<int64_t>>(bias_sizes)), d::from(s), d::from(p),
      d::from(dil), d::from(false), d::from(op), d::from(int64_t{1}), d::from(mask)};
  TORCH_ERROR_CODE_CHECK(torch_call_dispatcher("aten::convolution_backward", "", stack.data(),
                                               TORCH_ABI_VERSION));
  return {d::to<Tensor>(stack[0]), d::to<Tensor>(stack[1]), d::to<Tensor>(stack[2])};
}

// The project's debug hooks: *_kernels() -> str[], *_last_kernel() -> str,
// *_force_kernel(str, int) -> () backed by thread_local state.  thread_local
// is plain C++ and unaffected by the ABI; only the str / str[] / () boxing
// matters here.
namespace {
thread_local std::string forced = "none";
}
std::vector<std::string> kernel_names() { return {"cpu_loop", "none"}; }
std::string last_kernel() { return forced; }
void force_kernel(std::string name, int64_t split_k) {
  STD_TORCH_CHECK(split_k >= 0, "force_kernel: split_k must be >= 0");
  if (name != "cpu_loop" && name != "none")
    CUTLASS_OPS_WARN_ONCE("force_kernel: unknown kernel name; nothing will match");
  forced = name + "/" + std::to_string(split_k);
}

}  // namespace cutlass_ops_stable

STABLE_TORCH_LIBRARY(cutlass_ops_stable, m) {
  m.def("relu_backward(Tensor grad, Tensor out) -> Tensor");
  m.def("conv2d_fallback(Tensor x, Tensor w, Tensor? bias, int stride, int padding) -> Tensor");
  m.def("conv2d_backward_fallback(Tensor grad_out, Tensor x, Tensor w, int stride, int padding)"
        " -> (Tensor, Tensor, Tensor)");
  m.def("kernel_names() -> str[]");
  m.def("last_kernel() -> str");
  m.def("force_kernel(str name, int split_k=0) -> ()");
}

// Ops with no tensor argument cannot dispatch on CPU/CUDA: register them for
// CompositeExplicitAutograd (the existing code uses m.def(schema, fn), which
// the stable StableLibrary::def does not offer).
STABLE_TORCH_LIBRARY_IMPL(cutlass_ops_stable, CompositeExplicitAutograd, m) {
  m.impl("kernel_names", TORCH_BOX(&cutlass_ops_stable::kernel_names));
  m.impl("last_kernel", TORCH_BOX(&cutlass_ops_stable::last_kernel));
  m.impl("force_kernel", TORCH_BOX(&cutlass_ops_stable::force_kernel));
}

STABLE_TORCH_LIBRARY_IMPL(cutlass_ops_stable, CPU, m) {
  m.impl("relu_backward", TORCH_BOX(&cutlass_ops_stable::relu_backward));
  m.impl("conv2d_fallback", TORCH_BOX(&cutlass_ops_stable::conv2d_fallback));
  m.impl("conv2d_backward_fallback", TORCH_BOX(&cutlass_ops_stable::conv2d_backward_fallback));
}
