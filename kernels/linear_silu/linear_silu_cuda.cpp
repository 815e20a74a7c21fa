// CUDA implementation of cutlass_ops::linear_silu: the generated family-90 kernels
// (linear_silu_sm90_instance.cuh) on an sm90 GPU for fp16/bf16 with 16-byte aligned rows
// (K and N multiples of 8), ATen's path (linear_silu_op.cpp) otherwise.
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/cuda_device.h"
#include "linear_silu/linear_silu_args.h"
#include "linear_silu/linear_silu_op.h"

namespace cutlass_ops {
namespace linear_silu {

namespace {
bool aligned16(void const* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// CUTLASS_OPS_LINEAR_SILU_TILE=<instance name>: only that instance (to time each; the ATen path
// where it does not apply); read per call.
char const* forced_instance() {
  char const* v = std::getenv("CUTLASS_OPS_LINEAR_SILU_TILE");
  return v != nullptr && v[0] != '\0' ? v : nullptr;
}
}  // namespace

Tensor linear_silu_cuda(Tensor const& x, Tensor const& weight, std::optional<Tensor> const& bias, double alpha) {
  check_inputs(x, weight, bias, alpha);
  ScalarType const dtype = x.scalar_type();
  int64_t const k = x.size(x.dim() - 1), n = weight.size(0), m = k > 0 ? x.numel() / k : 0;
  int const dev = x.get_device_index();
  bool fused = (dtype == kHalf || dtype == kBFloat16) && kLinearSiluInstanceCount > 0 && m > 0 && n > 0 &&
               k > 0 && k % 8 == 0 && n % 8 == 0 && m <= INT32_MAX && n <= INT32_MAX && k <= INT32_MAX &&
               compute_capability(dev) == 90;
  if (!fused) return linear_silu_aten(x, weight, bias, alpha);
  DeviceGuard guard(dev);
  Tensor xc = torch::stable::contiguous(x), wc = torch::stable::contiguous(weight);
  // TMA reads x and weight, the epilogue the bias, 16 bytes at a time
  if (!aligned16(xc.data_ptr()) || !aligned16(wc.data_ptr())) return linear_silu_aten(x, weight, bias, alpha);
  Tensor bc;
  if (bias) {
    bc = torch::stable::contiguous(to_dtype(*bias, dtype));  // read in y's dtype
    if (!aligned16(bc.data_ptr())) {  // a view into another tensor: a fresh (aligned) copy
      Tensor copy = empty({n}, dtype, x.device());
      torch::stable::copy_(copy, bc);
      bc = copy;
    }
  }
  std::vector<int64_t> out_sizes = to_vector(x.sizes());
  out_sizes.back() = n;
  Tensor y = empty(IntArrayRef(out_sizes), dtype, x.device());
  LinearSiluArgs a{};
  a.dtype = dtype == kHalf ? DType::kF16 : DType::kBF16;
  a.m = static_cast<int>(m);
  a.n = static_cast<int>(n);
  a.k = static_cast<int>(k);
  a.x = xc.data_ptr();
  a.weight = wc.data_ptr();
  a.bias = bias ? bc.data_ptr() : nullptr;
  a.alpha = static_cast<float>(alpha);
  a.y = y.data_ptr();
  a.device = dev;
  a.sm_count = multiprocessor_count(dev);
  char const* forced = forced_instance();
  cudaStream_t stream = current_cuda_stream(dev);
  for (int i = 0; i < kLinearSiluInstanceCount; ++i) {
    LinearSiluInstance const& inst = kLinearSiluInstances[i];
    if (inst.dtype != a.dtype) continue;
    if (forced != nullptr ? std::strcmp(forced, inst.name) != 0 : a.k < inst.min_k && a.m >= inst.small_m) continue;
    size_t const bytes = inst.workspace_bytes(a);
    Tensor workspace = bytes > 0 ? empty({static_cast<int64_t>(bytes)}, kByte, x.device()) : Tensor();
    int const status = inst.run(a, bytes > 0 ? workspace.data_ptr() : nullptr, stream);
    if (status == 0) {
      CUTLASS_OPS_CUDA_CHECK(cudaGetLastError());
      return y;
    }
    CUTLASS_OPS_CHECK(status > 0, "linear_silu: kernel ", inst.name, " failed to start (CUTLASS status ", -status,
                      "): ", cudaGetErrorString(cudaGetLastError()));
  }
  return linear_silu_aten(x, weight, bias, alpha);  // no instance implements the call
}

// "<name> (<dtype>)" for each fused kernel of this build (none without family 90).
std::vector<std::string> kernel_names() {
  std::vector<std::string> names;
  for (int i = 0; i < kLinearSiluInstanceCount; ++i)
    names.push_back(std::string(kLinearSiluInstances[i].name) +
                    (kLinearSiluInstances[i].dtype == DType::kF16 ? " (float16)" : " (bfloat16)"));
  return names;
}

}  // namespace linear_silu
}  // namespace cutlass_ops

STABLE_TORCH_LIBRARY_FRAGMENT(cutlass_ops, m) {
  // The generated linear_silu kernels of this build (not registered in a CPU-only build).
  m.def("linear_silu_kernels() -> str[]");
}

STABLE_TORCH_LIBRARY_IMPL(cutlass_ops, CompositeExplicitAutograd, m) {
  m.impl("linear_silu_kernels", TORCH_BOX(&cutlass_ops::linear_silu::kernel_names));
}

STABLE_TORCH_LIBRARY_IMPL(cutlass_ops, CUDA, m) {
  m.impl("linear_silu", TORCH_BOX(&cutlass_ops::linear_silu::linear_silu_cuda));
}
