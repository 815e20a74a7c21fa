#include "dw_conv3x3_tokens/dw_conv3x3_tokens_kernel.h"

#include <climits>
#include <cstdlib>
#include <cstring>

#include "common/dynamic_smem.h"
#include "dw_conv3x3_tokens/dw_conv3x3_tokens_device.cuh"

namespace cutlass_ops {
namespace dw_conv {

// CUTLASS_OPS_DW_TILE=0: the strip kernel everywhere (read at each launch, so that one process
// can time both).
static bool tiled_enabled() {
  const char* v = std::getenv("CUTLASS_OPS_DW_TILE");
  return !(v && std::strcmp(v, "0") == 0);
}

// CUTLASS_OPS_DW_TILE_BYTES=<n>: the tiled kernel's band at most n bytes of shared memory (8192 to
// 200000; default kTileMaxBytes), to time other band heights; read at each launch.
static long long tile_max_bytes() {
  const char* v = std::getenv("CUTLASS_OPS_DW_TILE_BYTES");
  const long long n = v ? std::atoll(v) : 0;
  return n >= 8192 && n <= 200000 ? n : kTileMaxBytes;
}

template <typename T>
static cudaError_t launch_typed(DwConvArgs const& a, int num_sms, cudaStream_t stream) {
  const DwConvPlan p = dw_conv_plan(a, num_sms, tiled_enabled(), tile_max_bytes());
  if (a.layer_norm && !(p.tiled && p.grid <= INT32_MAX)) return cudaErrorInvalidValue;  // (dw_conv_tiled)
  if (p.tiled && p.grid <= INT32_MAX) {
    cudaError_t err = allow_dynamic_smem(dw_conv_tile_kernel<T>, static_cast<size_t>(p.smem_bytes));
    if (err != cudaSuccess) return err;
    dw_conv_tile_kernel<T><<<static_cast<unsigned>(p.grid), kTileThreads, p.smem_bytes, stream>>>(a, p.shape);
    return cudaGetLastError();
  }
  const int grid = static_cast<int>(dw_conv_ctas(a, p.vec, 32LL * num_sms));
  with_kernel_variant(p.vec, a.params_f32, [&](auto v, auto packed) {
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

bool dw_conv_tiled(DwConvArgs const& a, int num_sms) {
  const DwConvPlan p = dw_conv_plan(a, num_sms, tiled_enabled(), tile_max_bytes());
  return p.tiled && p.grid <= INT32_MAX;
}

cudaError_t launch_dw_conv(DwConvArgs const& a, int num_sms, cudaStream_t stream) {
  if (a.n == 0 || a.c == 0) return cudaSuccess;
  return a.dtype == DType::kF16 ? launch_typed<__half>(a, num_sms, stream)
                                : launch_typed<__nv_bfloat16>(a, num_sms, stream);
}

}  // namespace dw_conv
}  // namespace cutlass_ops
