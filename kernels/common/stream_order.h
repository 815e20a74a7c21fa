#pragma once

#include <cuda_runtime.h>

#include "common/cuda_device.h"

namespace cutlass_ops {

// Makes `waiter` wait for all work issued so far on `producer` (under CUDA-graph capture:
// a graph edge), with the runtime's own event (the stable ABI has no CUDAEvent).  Destroying
// the event right away is allowed: the wait already holds what it needs.
inline void stream_wait_for(cudaStream_t waiter, cudaStream_t producer) {
  cudaEvent_t event;
  CUTLASS_OPS_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  CUTLASS_OPS_CUDA_CHECK(cudaEventRecord(event, producer));
  CUTLASS_OPS_CUDA_CHECK(cudaStreamWaitEvent(waiter, event, 0));
  CUTLASS_OPS_CUDA_CHECK(cudaEventDestroy(event));
}

}  // namespace cutlass_ops
