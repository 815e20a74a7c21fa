#include "dw_conv/dw_conv_kernel.h"

#include "dw_conv/dw_conv_device.cuh"

namespace cutlass_ops {
namespace dw_conv {

template <typename T>
static cudaError_t launch_typed(DwConvArgs const& a, int num_sms, cudaStream_t stream) {
  const int vec = dw_conv_vec(a);
  const int grid = static_cast<int>(dw_conv_ctas(a, vec, 32LL * num_sms));
  with_kernel_variant(vec, a.params_f32, [&](auto v, auto packed) {
    dw_conv_kernel<T, decltype(v)::value, decltype(packed)::value><<<grid, kThreads, 0, stream>>>(a);
  });
  return cudaGetLastError();
}

template <typename T>
static cudaError_t launch_backward_typed(DwConvBackwardArgs const& a, int num_sms, cudaStream_t stream) {
  const int vec = dw_conv_backward_vec(a);
  const int grid = static_cast<int>(dw_conv_backward_ctas(a, vec, 32LL * num_sms));
  with_kernel_variant(vec, a.params_f32, [&](auto v, auto packed) {
    dw_conv_backward_input_kernel<T, decltype(v)::value, decltype(packed)::value><<<grid, kThreads, 0, stream>>>(a);
  });
  return cudaGetLastError();
}

cudaError_t launch_dw_conv_backward_input(DwConvBackwardArgs const& a, int num_sms, cudaStream_t stream) {
  if (a.n == 0 || a.c == 0 || a.h == 0 || a.w == 0) return cudaSuccess;
  return a.dtype == DType::kF16 ? launch_backward_typed<__half>(a, num_sms, stream)
                                : launch_backward_typed<__nv_bfloat16>(a, num_sms, stream);
}

cudaError_t launch_dw_conv(DwConvArgs const& a, int num_sms, cudaStream_t stream) {
  if (a.n == 0 || a.c == 0) return cudaSuccess;
  return a.dtype == DType::kF16 ? launch_typed<__half>(a, num_sms, stream)
                                : launch_typed<__nv_bfloat16>(a, num_sms, stream);
}

}  // namespace dw_conv
}  // namespace cutlass_ops
