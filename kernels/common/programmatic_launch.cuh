// Programmatic dependent launch (Hopper and later).  A kernel launched with
// cudaLaunchAttributeProgrammaticStreamSerialization may be scheduled while the previous
// kernel in the stream is still running; it must wait (griddepcontrol.wait) before it
// reads or writes memory.  What that buys: the next kernel's launch and CTA setup overlap
// this one's tail, which matters when a forward is sixteen short kernels.  CUDA graphs
// keep these edges when the stream is captured.  No torch here (kernel files include it).
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "common/grid_dependency.cuh"

namespace cutlass_ops {

// Whether the code the driver loaded for kKernel was compiled for sm90 or later, so it
// contains the wait.  (A build for sm80 only, run on an H100 through PTX JIT, does not:
// launching that early would race.)
template <auto kKernel>
bool kernel_waits_for_previous_grid() {
  static bool const waits = [] {
    cudaFuncAttributes attr{};
    bool ok = cudaFuncGetAttributes(&attr, kKernel) == cudaSuccess;
    if (!ok) cudaGetLastError();  // not this launch's error
    return ok && attr.ptxVersion >= 90;
  }();
  return waits;
}

// kKernel<<<grid, block, smem, stream>>>(args...), as a programmatic dependent of the
// previous kernel when `programmatic` (the caller's choice: device sm90+ and not turned off
// by CUTLASS_OPS_PDL=0) and the kernel's code has the wait.
template <auto kKernel, typename... Args>
cudaError_t launch_kernel(dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                          bool programmatic, Args&&... args) {
  cudaLaunchAttribute attr[1] = {};
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  if (programmatic && kernel_waits_for_previous_grid<kKernel>()) {
    config.attrs = attr;
    config.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&config, kKernel, std::forward<Args>(args)...);
}

}  // namespace cutlass_ops
