// Lets a kernel launch with `dynamic_bytes` of dynamic shared memory.  Past 48 KB per block a
// kernel needs the opt-in attribute, and those 48 KB include its static __shared__ arrays:
// a launch with 48 KB of dynamic memory and any static memory fails ("invalid argument")
// without it.  The attribute is read (and set) only near or past the limit, where a kernel's
// static memory could matter: this library's kernels have at most a few KB of it.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace cutlass_ops {

template <class Kernel>
cudaError_t allow_dynamic_smem(Kernel kernel, size_t dynamic_bytes) {
  constexpr size_t kDefaultLimit = 48 * 1024, kStaticAllowance = 8 * 1024;
  if (dynamic_bytes + kStaticAllowance <= kDefaultLimit) return cudaSuccess;
  cudaFuncAttributes attributes{};
  cudaError_t err = cudaFuncGetAttributes(&attributes, kernel);
  if (err != cudaSuccess) return err;
  if (attributes.sharedSizeBytes + dynamic_bytes <= kDefaultLimit) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(dynamic_bytes));
}

}  // namespace cutlass_ops
