// Device facts the op entry points need per call.  cudaDeviceGetAttribute is cheap
// (cudaGetDeviceProperties is not), so they are looked up each time, not cached.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

namespace cutlass_ops {

inline int device_attribute(cudaDeviceAttr attr, int device) {
  int value = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&value, attr, device));
  return value;
}

// e.g. 90 for an H100/H200.
inline int compute_capability(int device) {
  return 10 * device_attribute(cudaDevAttrComputeCapabilityMajor, device) +
         device_attribute(cudaDevAttrComputeCapabilityMinor, device);
}

inline int multiprocessor_count(int device) {
  return device_attribute(cudaDevAttrMultiProcessorCount, device);
}

}  // namespace cutlass_ops
