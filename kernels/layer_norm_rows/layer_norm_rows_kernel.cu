#include "layer_norm_rows/layer_norm_rows_kernel.h"

#include "layer_norm_rows/layer_norm_rows_device.cuh"

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

template <typename T>
struct LaunchBackward {
  LayerNormBackwardArgs const& a;
  int grid;
  cudaStream_t stream;
  template <bool kGradSum, bool kParamGrads, int kVec, int kLanes, int kChunks>
  void go() const {
    layer_norm_backward_kernel<T, kVec, kLanes, kChunks, kGradSum, kParamGrads><<<grid, kThreads, 0, stream>>>(a);
  }
  template <int kVec, int kLanes, int kChunks>
  cudaError_t run() const {
    if constexpr (kVec * kChunks > 32) {  // wider than layer_norm_backward_shape picks
      return cudaErrorInvalidValue;
    } else {
      if (a.grad_sum && a.partials) go<true, true, kVec, kLanes, kChunks>();
      else if (a.grad_sum) go<true, false, kVec, kLanes, kChunks>();
      else if (a.partials) go<false, true, kVec, kLanes, kChunks>();
      else go<false, false, kVec, kLanes, kChunks>();
      return cudaGetLastError();
    }
  }
};

// The backward's grid: enough CTAs to keep the loads in flight (2 per SM), few enough that
// the per-CTA partial sums stay small next to the rows.
long long backward_ctas(LayerNormBackwardArgs const& a, int num_sms) {
  return layer_norm_ctas(a.rows, layer_norm_backward_shape(a).lanes, 2LL * num_sms);
}

}  // namespace

bool layer_norm_backward_supported(LayerNormBackwardArgs const& a) {
  return a.cols > 0 && layer_norm_backward_shape(a).lanes > 0;
}

long long layer_norm_backward_partial_rows(LayerNormBackwardArgs const& a, int num_sms) {
  return backward_ctas(a, num_sms);
}

cudaError_t launch_layer_norm_backward(LayerNormBackwardArgs const& a, int num_sms, cudaStream_t stream) {
  const LayerNormShape sh = layer_norm_backward_shape(a);
  if (sh.lanes == 0) return cudaErrorInvalidValue;
  const long long grid = backward_ctas(a, num_sms);
  if (a.partials && a.partial_rows != grid) return cudaErrorInvalidValue;
  if (a.rows == 0) return cudaSuccess;  // (the caller zeroes the partials)
  return a.dtype == DType::kF16
             ? with_layer_norm_shape(sh, LaunchBackward<__half>{a, static_cast<int>(grid), stream})
             : with_layer_norm_shape(sh, LaunchBackward<__nv_bfloat16>{a, static_cast<int>(grid), stream});
}

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
