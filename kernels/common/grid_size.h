// Grid sizes of the kernels that write one partial sum (or row of partials) per block:
// enough blocks for the work, at least one, at most a cap that fills the GPU (grid-stride
// beyond it).  No torch here: the kernels' launch code uses it.
#pragma once

namespace cutlass_ops {

inline int clamp_grid(long long needed, long long cap) {
  return int(needed < 1 ? 1 : (needed < cap ? needed : cap));
}

}  // namespace cutlass_ops
