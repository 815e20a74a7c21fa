#pragma once

#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

namespace cutlass_ops {

// Makes `waiter` wait for all work issued so far on `producer` (under CUDA-graph capture:
// a graph edge).  Uses the runtime's own event rather than ATen/cuda/CUDAEvent.h, whose
// include chain needs cusparse.h, which a plain CUDA toolkit may lack.  Destroying the event
// right away is allowed: the wait already holds what it needs.
inline void stream_wait_for(cudaStream_t waiter, cudaStream_t producer) {
  cudaEvent_t event;
  C10_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  C10_CUDA_CHECK(cudaEventRecord(event, producer));
  C10_CUDA_CHECK(cudaStreamWaitEvent(waiter, event, 0));
  C10_CUDA_CHECK(cudaEventDestroy(event));
}

}  // namespace cutlass_ops
