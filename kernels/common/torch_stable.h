// The torch API of the op library: LibTorch's stable ABI (torch/csrc/stable, C symbols only),
// compiled with TORCH_TARGET_VERSION = 2.11 (cmake/TorchFromPython.cmake), so one build loads into torch
// 2.11 and every later torch.  No ATen/c10 C++ header may be included by an op source;
// tests/python/test_library_checks.py checks the built library's symbols.
//
// What the stable API of torch 2.11 lacks, and this header adds on top of it:
// - errors: CUTLASS_OPS_CHECK_VALUE throws std::invalid_argument, which torch's Python
//   binding raises as ValueError (TORCH_CHECK_VALUE's c10::ValueError is C++ ABI);
//   CUTLASS_OPS_CHECK throws std::runtime_error (RuntimeError);
// - warnings: CUTLASS_OPS_WARN_ONCE (TORCH_WARN_ONCE's) through the C shim's aoti_torch_warn;
// - ATen ops outside torch/csrc/stable/ops.h: called by schema name through
//   torch_call_dispatcher (`aten_call`); an error inside such an op reaches Python as a
//   RuntimeError naming the op, its own message only on stderr (the ABI returns a code).
//   Its StableIValue conversion has no Scalar in 2.11, so only Tensor overloads are used,
//   numbers become 0-dim CPU tensors (`scalar_like`), and the arithmetic operators below are
//   written on them;
// - the current CUDA stream as a cudaStream_t (aoti_torch_get_current_cuda_stream).
#pragma once

#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#ifdef USE_CUDA
#include <cuda_runtime.h>
#endif

#include <array>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace cutlass_ops {

using Tensor = torch::stable::Tensor;
using Device = torch::stable::Device;
using ScalarType = torch::headeronly::ScalarType;
using MemoryFormat = torch::headeronly::MemoryFormat;
using IntArrayRef = torch::headeronly::IntHeaderOnlyArrayRef;

constexpr ScalarType kHalf = ScalarType::Half;
constexpr ScalarType kBFloat16 = ScalarType::BFloat16;
constexpr ScalarType kFloat = ScalarType::Float;
constexpr ScalarType kDouble = ScalarType::Double;
constexpr ScalarType kInt = ScalarType::Int;
constexpr ScalarType kLong = ScalarType::Long;
constexpr ScalarType kBool = ScalarType::Bool;
constexpr ScalarType kByte = ScalarType::Byte;
constexpr MemoryFormat kChannelsLast = MemoryFormat::ChannelsLast;
constexpr MemoryFormat kContiguous = MemoryFormat::Contiguous;

// ATen's isFloatingType: the float8/float4 types count (the CPU composites accept them).
inline bool is_floating(ScalarType t) {
  switch (t) {
    case ScalarType::Half: case ScalarType::BFloat16: case ScalarType::Float: case ScalarType::Double:
    case ScalarType::Float8_e5m2: case ScalarType::Float8_e4m3fn: case ScalarType::Float8_e5m2fnuz:
    case ScalarType::Float8_e4m3fnuz: case ScalarType::Float8_e8m0fnu: case ScalarType::Float4_e2m1fn_x2:
      return true;
    default:
      return false;
  }
}
inline bool is_complex(ScalarType t) {
  return t == ScalarType::ComplexHalf || t == ScalarType::ComplexFloat || t == ScalarType::ComplexDouble;
}

// ---- error messages, formatted as ATen formats them: Float, [2, 3], cuda:0 ----

namespace detail {
template <class T>
void put(std::ostream& s, T const& v) { s << v; }
inline void put(std::ostream& s, ScalarType t) { s << torch::headeronly::toString(t); }
inline void put(std::ostream& s, IntArrayRef a) {
  s << '[';
  for (size_t i = 0; i < a.size(); ++i) s << (i ? ", " : "") << a[i];
  s << ']';
}
inline void put(std::ostream& s, std::vector<int64_t> const& a) { put(s, IntArrayRef(a)); }
inline void put(std::ostream& s, Device const& d) {
  if (d.is_cuda()) {
    s << "cuda";
  } else if (d.is_cpu()) {
    s << "cpu";
  } else {
    s << "device type " << int(d.type());
  }
  if (d.has_index()) s << ':' << int(d.index());
}
}  // namespace detail

template <class... A>
std::string str_cat(A const&... a) {
  std::ostringstream s;
  (detail::put(s, a), ...);
  return s.str();
}

#define CUTLASS_OPS_CHECK_VALUE(cond, ...) \
  do {                                     \
    if (!(cond)) throw std::invalid_argument(::cutlass_ops::str_cat(__VA_ARGS__)); \
  } while (0)
#define CUTLASS_OPS_CHECK(cond, ...) \
  do {                               \
    if (!(cond)) throw std::runtime_error(::cutlass_ops::str_cat(__VA_ARGS__)); \
  } while (0)

// TORCH_WARN_ONCE: through the C shim's aoti_torch_warn, to torch's warning handler (as
// TORCH_WARN: a Python UserWarning where torch installs its handler, else stderr), once per
// call site and process.
#define CUTLASS_OPS_WARN_ONCE(...)                                                          \
  do {                                                                                      \
    static std::once_flag cutlass_ops_warned_;                                              \
    char const* cutlass_ops_func_ = __func__;                                               \
    std::call_once(cutlass_ops_warned_, [&] {                                               \
      aoti_torch_warn(cutlass_ops_func_, __FILE__, static_cast<uint32_t>(__LINE__),         \
                      ::cutlass_ops::str_cat(__VA_ARGS__).c_str());                         \
    });                                                                                     \
  } while (0)

// ---- ATen ops by schema name ----

// A bool[] argument (e.g. convolution_backward's output_mask): std::vector<bool> has no
// StableIValue conversion, so it is boxed as a StableList by hand.
struct BoolList {
  std::vector<bool> values;
};

namespace detail {
template <class T>
StableIValue box(T const& v) { return torch::stable::detail::from(v); }
inline StableIValue box(BoolList const& list) {
  StableListHandle handle;
  TORCH_ERROR_CODE_CHECK(torch_new_list_reserve_size(list.values.size(), &handle));
  for (bool b : list.values) TORCH_ERROR_CODE_CHECK(torch_list_push_back(handle, torch::stable::detail::from(b)));
  return torch::stable::detail::from(handle);
}
}  // namespace detail

// Calls aten::<name>.<overload> with every argument of its schema, defaults included (the
// dispatcher call takes no defaults), and returns the first result.  int[] arguments as
// std::vector<int64_t> or IntArrayRef, int? as std::optional<int64_t>, Tensor[] as
// std::vector<Tensor>, bool[] as BoolList; no Scalar.
namespace detail {
// torch prints the op's own error to stderr; the stable ABI hands back only a code.
inline void check_call(AOTITorchError err, char const* name, char const* overload) {
  if (err != AOTI_TORCH_SUCCESS)
    throw std::runtime_error(str_cat("cutlass_ops: ", name, overload[0] ? "." : "", overload,
                                     " failed (torch printed its error above)"));
}
}  // namespace detail

template <class Result = Tensor, class... Args>
Result aten_call(char const* name, char const* overload, Args const&... args) {
  constexpr size_t n = sizeof...(Args) > 0 ? sizeof...(Args) : 1;
  std::array<StableIValue, n> stack{detail::box(args)...};
  detail::check_call(torch_call_dispatcher(name, overload, stack.data(), TORCH_ABI_VERSION), name, overload);
  return torch::stable::detail::to<Result>(stack[0]);
}

// The same for a schema with several results (at most as many as its arguments).
template <class... Results, class... Args>
std::tuple<Results...> aten_call_multi(char const* name, char const* overload, Args const&... args) {
  static_assert(sizeof...(Args) >= sizeof...(Results), "the stack holds the arguments, then the results");
  std::array<StableIValue, sizeof...(Args)> stack{detail::box(args)...};
  detail::check_call(torch_call_dispatcher(name, overload, stack.data(), TORCH_ABI_VERSION), name, overload);
  return torch::stable::detail::unbox_to_tuple<Results...>(stack.data());
}

inline std::optional<Tensor> opt(Tensor const& t) { return t.defined() ? std::optional<Tensor>(t) : std::nullopt; }

// ---- creation and conversion ----

inline Tensor empty(IntArrayRef sizes, ScalarType dtype, Device device, MemoryFormat format = kContiguous) {
  return torch::stable::empty(sizes, dtype, std::nullopt, device, std::nullopt, format);
}
inline Tensor zeros(IntArrayRef sizes, ScalarType dtype, Device device) {
  return torch::stable::full(sizes, 0.0, dtype, std::nullopt, device);
}
// A number in an expression with tensor t, as ATen passes a C++ scalar (`t * 0.5`): a 0-dim
// CPU tensor in t's dtype (float32 for a fractional number with an integer t), whatever t's
// device (CUDA kernels take it as a "CPU scalar": division by one becomes multiplication by
// its reciprocal, as in the ATen expression; no fill kernel, nothing to capture).
inline Tensor scalar_tensor(double value, ScalarType dtype, Device device) {
  return torch::stable::full({}, value, dtype, std::nullopt, device);
}
inline Tensor scalar_like(Tensor const& t, double value) {
  ScalarType dtype = t.scalar_type();
  if (!is_floating(dtype) && !is_complex(dtype) && double(int64_t(value)) != value) dtype = kFloat;
  return scalar_tensor(value, dtype, Device(torch::headeronly::DeviceType::CPU));
}
inline Tensor to_dtype(Tensor const& t, ScalarType dtype) {
  return t.scalar_type() == dtype ? t : torch::stable::to(t, dtype);
}
// A kernel's weight and bias as it reads them (load_param, common/half_chunk.cuh): as they are
// where each given one is in x's dtype (a 16-bit model's own: no cast kernel per call), else
// both as float32; contiguous; undefined where not given.
struct KernelParams {
  Tensor weight, bias;
  bool f32;
};
inline KernelParams kernel_params(std::optional<Tensor> const& weight, std::optional<Tensor> const& bias,
                                  ScalarType x_dtype) {
  bool const native = (!weight || weight->scalar_type() == x_dtype) && (!bias || bias->scalar_type() == x_dtype);
  ScalarType const t = native ? x_dtype : kFloat;
  return {weight ? torch::stable::contiguous(to_dtype(*weight, t)) : Tensor(),
          bias ? torch::stable::contiguous(to_dtype(*bias, t)) : Tensor(), !native};
}
// Whether a 4-D tensor is dense in channels_last order (ATen's definition: size-1 dims
// may have any stride).
// t.narrow(dim, start, length) on a const tensor or a temporary (torch::stable::narrow takes a
// non-const reference; the view shares t's storage either way).
inline Tensor narrowed(Tensor t, int64_t dim, int64_t start, int64_t length) {
  return torch::stable::narrow(t, dim, start, length);
}

inline bool is_channels_last(Tensor const& t) {
  if (t.dim() != 4) return false;
  int64_t expected = 1;
  for (int64_t d : {1, 3, 2, 0}) {
    int64_t const size = t.size(d);
    if (size == 1) continue;
    if (t.stride(d) != expected) return false;
    expected *= size;
  }
  return true;
}
inline bool operator==(IntArrayRef a, IntArrayRef b) { return a.equals(b); }
inline bool operator!=(IntArrayRef a, IntArrayRef b) { return !a.equals(b); }
inline size_t nbytes(Tensor const& t) { return size_t(t.numel()) * t.element_size(); }
inline std::vector<int64_t> to_vector(IntArrayRef a) { return std::vector<int64_t>(a.begin(), a.end()); }

// ---- elementwise math (Tensor overloads only; see the header comment) ----

// a - alpha * b through the stable subtract (its alpha is a double, which ATen refuses for
// integer tensors: those go through float64, exact below 2^53, and back).
inline Tensor subtract_alpha(Tensor const& a, Tensor const& b, double alpha) {
  if (is_floating(a.scalar_type()) || is_floating(b.scalar_type())) return torch::stable::subtract(a, b, alpha);
  auto result = aten_call<ScalarType>("aten::result_type", "Tensor", a, b);
  return to_dtype(torch::stable::subtract(to_dtype(a, kDouble), to_dtype(b, kDouble), alpha), result);
}
inline Tensor add(Tensor const& a, Tensor const& b) { return subtract_alpha(a, b, -1.0); }
inline Tensor sub(Tensor const& a, Tensor const& b) { return subtract_alpha(a, b, 1.0); }
inline Tensor mul(Tensor const& a, Tensor const& b) { return aten_call("aten::mul", "Tensor", a, b); }
inline Tensor div(Tensor const& a, Tensor const& b) { return aten_call("aten::div", "Tensor", a, b); }
inline Tensor neg(Tensor const& a) { return aten_call("aten::neg", "", a); }
inline Tensor maximum(Tensor const& a, Tensor const& b) { return aten_call("aten::maximum", "", a, b); }
inline Tensor minimum(Tensor const& a, Tensor const& b) { return aten_call("aten::minimum", "", a, b); }
inline Tensor where(Tensor const& cond, Tensor const& a, Tensor const& b) {
  return aten_call("aten::where", "self", cond, a, b);
}
inline Tensor relu(Tensor const& a) { return aten_call("aten::relu", "", a); }
inline Tensor sigmoid(Tensor const& a) { return aten_call("aten::sigmoid", "", a); }
inline Tensor logical_and(Tensor const& a, Tensor const& b) { return aten_call("aten::logical_and", "", a, b); }
inline Tensor gt(Tensor const& a, Tensor const& b) { return aten_call("aten::gt", "Tensor", a, b); }
inline Tensor ge(Tensor const& a, Tensor const& b) { return aten_call("aten::ge", "Tensor", a, b); }
inline Tensor lt(Tensor const& a, Tensor const& b) { return aten_call("aten::lt", "Tensor", a, b); }
inline Tensor le(Tensor const& a, Tensor const& b) { return aten_call("aten::le", "Tensor", a, b); }
inline Tensor eq(Tensor const& a, Tensor const& b) { return aten_call("aten::eq", "Tensor", a, b); }
inline Tensor ne(Tensor const& a, Tensor const& b) { return aten_call("aten::ne", "Tensor", a, b); }

inline Tensor operator+(Tensor const& a, Tensor const& b) { return add(a, b); }
inline Tensor operator-(Tensor const& a, Tensor const& b) { return sub(a, b); }
inline Tensor operator*(Tensor const& a, Tensor const& b) { return mul(a, b); }
inline Tensor operator/(Tensor const& a, Tensor const& b) { return div(a, b); }
inline Tensor operator-(Tensor const& a) { return neg(a); }
inline Tensor operator+(Tensor const& a, double b) { return add(a, scalar_like(a, b)); }
inline Tensor operator-(Tensor const& a, double b) { return sub(a, scalar_like(a, b)); }
inline Tensor operator*(Tensor const& a, double b) { return mul(a, scalar_like(a, b)); }
inline Tensor operator/(Tensor const& a, double b) { return div(a, scalar_like(a, b)); }
inline Tensor operator+(double a, Tensor const& b) { return add(scalar_like(b, a), b); }
inline Tensor operator-(double a, Tensor const& b) { return sub(scalar_like(b, a), b); }
inline Tensor operator*(double a, Tensor const& b) { return mul(scalar_like(b, a), b); }
inline Tensor operator/(double a, Tensor const& b) { return div(scalar_like(b, a), b); }
inline Tensor operator>(Tensor const& a, Tensor const& b) { return gt(a, b); }
inline Tensor operator>=(Tensor const& a, Tensor const& b) { return ge(a, b); }
inline Tensor operator<(Tensor const& a, Tensor const& b) { return lt(a, b); }
inline Tensor operator<=(Tensor const& a, Tensor const& b) { return le(a, b); }
inline Tensor operator>(Tensor const& a, double b) { return gt(a, scalar_like(a, b)); }
inline Tensor operator<(Tensor const& a, double b) { return lt(a, scalar_like(a, b)); }
inline Tensor operator&(Tensor const& a, Tensor const& b) { return logical_and(a, b); }

// ---- reductions and shapes ----

// Sum of all elements, accumulated and returned in `dtype`.
inline Tensor sum_all(Tensor const& t, ScalarType dtype) {
  return torch::stable::sum(t, std::nullopt, false, dtype);
}
inline Tensor sum_dims(Tensor const& t, std::vector<int64_t> const& dims, bool keepdim, ScalarType dtype) {
  return torch::stable::sum(t, IntArrayRef(dims), keepdim, dtype);
}
inline Tensor stack(std::vector<Tensor> const& tensors, int64_t dim = 0) {
  return aten_call("aten::stack", "", tensors, dim);
}
inline Tensor permute(Tensor const& t, std::vector<int64_t> const& dims) {
  return aten_call("aten::permute", "", t, dims);
}
inline Tensor transposed(Tensor const& t) { return aten_call("aten::t", "", t); }  // a 2-D t.t()
inline Tensor mm(Tensor const& a, Tensor const& b) { return aten_call("aten::mm", "", a, b); }
inline std::vector<Tensor> unbind(Tensor const& t, int64_t dim) {
  return aten_call<std::vector<Tensor>>("aten::unbind", "int", t, dim);
}

// ---- CUDA ----

#ifdef USE_CUDA
// torch's current stream on a device (what c10::cuda::getCurrentCUDAStream(i).stream() was).
inline cudaStream_t current_cuda_stream(int device_index) {
  void* stream = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(device_index, &stream));
  return static_cast<cudaStream_t>(stream);
}

// Makes `device` current for the scope (c10::cuda::CUDAGuard), and its primary context current
// on this thread.  torch's guard calls cudaSetDevice only when the device is not already the
// thread's current one, and a thread that has made no CUDA runtime call yet (an autograd device
// thread whose first work is one of our ops, a fresh Python thread) has device 0 "current" with
// no context bound: the driver calls made before the first launch (cuTensorMapEncodeTiled, for
// the TMA descriptors of the sm90 kernels) then fail with CUDA_ERROR_INVALID_CONTEXT and the
// kernel runs with a garbage descriptor.  cudaSetDevice binds the primary context (CUDA >= 12);
// it is called once per thread and device, and is legal during stream capture.
class DeviceGuard {
 public:
  explicit DeviceGuard(torch::stable::accelerator::DeviceIndex index) : guard_(index) {
    thread_local unsigned long long bound = 0;  // a bit per device index
    if (index >= 0 && index < 64 && !(bound >> index & 1ull)) {
      cudaError_t const e = cudaSetDevice(index);
      if (e != cudaSuccess) {
        throw std::runtime_error(std::string("cutlass_ops: cudaSetDevice(") + std::to_string(index) +
                                 ") failed: " + cudaGetErrorString(e));
      }
      bound |= 1ull << index;
    }
  }

 private:
  torch::stable::accelerator::DeviceGuard guard_;
};
#endif

}  // namespace cutlass_ops
