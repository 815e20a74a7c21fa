#include "layer_norm/layer_norm_kernel.h"

#include "layer_norm/layer_norm_device.cuh"

namespace cutlass_ops {
namespace layer_norm {
namespace {

template <typename T>
struct Launch {
  LayerNormArgs const& a;
  int num_sms;
  cudaStream_t stream;
  template <int kVec, int kLanes, int kChunks>
  cudaError_t run() const {
    const int grid = static_cast<int>(layer_norm_ctas(a.rows, kLanes, 16LL * num_sms));
    if (a.residual)
      layer_norm_kernel<T, kVec, kLanes, kChunks, true><<<grid, kThreads, 0, stream>>>(a);
    else
      layer_norm_kernel<T, kVec, kLanes, kChunks, false><<<grid, kThreads, 0, stream>>>(a);
    return cudaGetLastError();
  }
};

}  // namespace

bool layer_norm_supported(LayerNormArgs const& a) { return a.cols > 0 && layer_norm_shape(a).lanes > 0; }

cudaError_t launch_layer_norm(LayerNormArgs const& a, int num_sms, cudaStream_t stream) {
  const LayerNormShape sh = layer_norm_shape(a);
  if (sh.lanes == 0) return cudaErrorInvalidValue;
  if (a.rows == 0) return cudaSuccess;
  return a.dtype == DType::kF16 ? with_layer_norm_shape(sh, Launch<__half>{a, num_sms, stream})
                                : with_layer_norm_shape(sh, Launch<__nv_bfloat16>{a, num_sms, stream});
}

}  // namespace layer_norm
}  // namespace cutlass_ops
