// Device facts the op entry points need per call.  cudaDeviceGetAttribute is cheap
// (cudaGetDeviceProperties is not), so they are looked up each time, not cached.
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace cutlass_ops {

// A failed CUDA runtime call as a RuntimeError naming the call and the error.
#define CUTLASS_OPS_CUDA_CHECK(expr)                                                              \
  do {                                                                                            \
    cudaError_t const cutlass_ops_err_ = (expr);                                                  \
    if (cutlass_ops_err_ != cudaSuccess)                                                          \
      throw std::runtime_error(std::string("CUDA error: ") + cudaGetErrorString(cutlass_ops_err_) + \
                               " (" #expr ", " __FILE__ ":" + std::to_string(__LINE__) + ")");    \
  } while (0)

inline int device_attribute(cudaDeviceAttr attr, int device) {
  int value = 0;
  CUTLASS_OPS_CUDA_CHECK(cudaDeviceGetAttribute(&value, attr, device));
  return value;
}

// e.g. 90 for an H100/H200.
inline int compute_capability(int device) {
  return 10 * device_attribute(cudaDevAttrComputeCapabilityMajor, device) +
         device_attribute(cudaDevAttrComputeCapabilityMinor, device);
}

// Whether our kernels launch as programmatic dependents of the previous kernel
// (common/programmatic_launch.cuh): on sm90+, unless CUTLASS_OPS_PDL=0 (to compare).
inline bool programmatic_launch_allowed(int device) {
  char const* env = std::getenv("CUTLASS_OPS_PDL");
  if (env != nullptr && env[0] == '0') return false;
  return compute_capability(device) >= 90;
}

inline int multiprocessor_count(int device) {
  return device_attribute(cudaDevAttrMultiProcessorCount, device);
}

}  // namespace cutlass_ops
