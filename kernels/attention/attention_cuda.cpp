// CUDA implementation of cutlass_ops::attention_tokens (kernel in attention_kernel.cu): fp16/bf16,
// head dim 64, at most 256 keys, 16-byte aligned rows, on sm80+ run the kernel; anything else
// ATen's path (attention_op.cpp).
#include <algorithm>
#include <cstdint>

#include "attention/attention_kernel.h"
#include "attention/attention_op.h"
#include "common/cuda_device.h"

namespace cutlass_ops {
namespace attention {

namespace {
// Token rows the kernel copies 16 bytes at a time: innermost stride 1, the rest and the pointer
// multiples of 8 elements (16 bytes).
bool rows_aligned(Tensor const& t) {
  return t.stride(2) == 1 && t.stride(1) % 8 == 0 && t.stride(0) % 8 == 0 &&
         reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 16 == 0;
}
}  // namespace

Tensor attention_tokens_cuda(Tensor const& q, Tensor const& k, Tensor const& v, int64_t heads, double scale) {
  check_inputs(q, k, v, heads, scale);
  ScalarType const dtype = q.scalar_type();
  int const dev = q.get_device_index();
  DeviceGuard guard(dev);
  bool const fits = (dtype == kHalf || dtype == kBFloat16) && q.size(2) == heads * kHeadDim &&
                    kernel_supports(compute_capability(dev), static_cast<int>(std::min<int64_t>(k.size(1), 1 << 20))) &&
                    q.size(0) <= 65535 && heads <= 65535 && q.size(1) < (int64_t(1) << 30) && rows_aligned(q) &&
                    rows_aligned(k) && rows_aligned(v);
  if (!fits) return attention_tokens_aten(q, k, v, heads, scale);
  Tensor out = empty({q.size(0), q.size(1), q.size(2)}, dtype, q.device());
  if (out.numel() == 0) return out;
  AttentionArgs a{};
  a.dtype = dtype == kHalf ? DType::kF16 : DType::kBF16;
  a.n = static_cast<int>(q.size(0));
  a.lq = static_cast<int>(q.size(1));
  a.lkv = static_cast<int>(k.size(1));
  a.heads = static_cast<int>(heads);
  a.q_row_stride = q.stride(1); a.k_row_stride = k.stride(1); a.v_row_stride = v.stride(1);
  a.q_image_stride = q.stride(0); a.k_image_stride = k.stride(0); a.v_image_stride = v.stride(0);
  a.q = q.data_ptr(); a.k = k.data_ptr(); a.v = v.data_ptr();
  a.o = out.data_ptr();
  a.scale = static_cast<float>(scale);
  a.programmatic_launch = programmatic_launch_allowed(dev);
  cudaError_t err = launch_attention(a, current_cuda_stream(dev));
  CUTLASS_OPS_CHECK(err == cudaSuccess, "attention_tokens: kernel launch failed: ", cudaGetErrorString(err));
  return out;
}

}  // namespace attention
}  // namespace cutlass_ops

STABLE_TORCH_LIBRARY_IMPL(cutlass_ops, CUDA, m) {
  m.impl("attention_tokens", TORCH_BOX(&cutlass_ops::attention::attention_tokens_cuda));
}
