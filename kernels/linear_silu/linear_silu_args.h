// What a linear_silu kernel instance receives (torch-free, shared by the generated family-90
// instances, their dispatch table and linear_silu_cuda.cpp): y = silu(alpha * (x @ weight^T + bias))
// on row-major x (m, k), weight (n, k), y (m, n), bias (n), all of one 16-bit dtype.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace cutlass_ops {
namespace linear_silu {

enum class DType { kF16, kBF16 };

struct LinearSiluArgs {
  DType dtype;
  int m, n, k;          // rows (tokens), output features, input features
  void const* x;        // (m, k), rows contiguous, 16-byte aligned
  void const* weight;   // (n, k), contiguous, 16-byte aligned
  void const* bias;     // (n,), or null
  float alpha;
  void* y;              // (m, n), contiguous, 16-byte aligned
  int device;
  int sm_count;         // the persistent kernels' grid
};

// One generated kernel instance: its name (as CUTLASS_OPS_LINEAR_SILU_TILE takes it), dtype, the
// generator's measured rule (tried for K >= min_k, or for any K when m < small_m; a forced
// instance ignores it), and entry points.  run() returns 0 on success; can_implement()'s refusal as its positive
// cutlass::Status (the caller tries the next instance, or the ATen path); a failed initialize()
// or launch as the negated status.
struct LinearSiluInstance {
  char const* name;
  DType dtype;
  int min_k;
  int small_m;
  size_t (*workspace_bytes)(LinearSiluArgs const&);
  int (*run)(LinearSiluArgs const&, void* workspace, cudaStream_t);
};

// The generated table (linear_silu_dispatch_table.cpp, empty without family 90), in the
// generator's order of preference.
extern LinearSiluInstance const kLinearSiluInstances[];
extern int const kLinearSiluInstanceCount;

}  // namespace linear_silu
}  // namespace cutlass_ops
