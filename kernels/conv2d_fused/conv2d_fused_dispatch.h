// The dispatch table the generator writes (conv2d_fused_dispatch_table.cpp in the build
// tree), and the run-time choice of a kernel from it.  No torch here: the C++ tests use it.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "cutlass/cutlass.h"
#include "conv2d_fused/conv2d_fused_args.h"

namespace cutlass_ops {
namespace conv2d_fused {

using KernelFn = cutlass::Status (*)(Conv2dFusedArgs const&, cudaStream_t);

struct KernelEntry {
  char const* name;
  int family;            // CUTLASS arch tag the kernel is written for: 70 or 80
  DType dtype;
  int alignment;         // channel alignment in elements (input C and output K)
  int tile_m, tile_n, tile_k, stages;
  KernelFn run;
};

extern const KernelEntry kKernels[];
extern const int kNumKernels;

// A measured winner (profiles/): for this problem class the kernel kKernels[kernel] with
// `split_k` serial split-K slices was fastest at GEMM M = gemm_m (= N*P*Q).
struct ProfileRule {
  int family;
  DType dtype;
  int alignment;
  int C, K, R, S, stride;
  long long gemm_m;
  int kernel;   // index into kKernels, -1 in an empty table
  int split_k;  // 1 = no split
};

extern const ProfileRule kProfileRules[];
extern const int kNumProfileRules;

// The profile rule for `a` (same class, nearest M on a log scale), or null when no rule
// covers the problem.
ProfileRule const* profile_rule(Conv2dFusedArgs const& a, int family, int alignment);

// Largest alignment in {8,4,2,1} that divides C and K and that every pointer honours.
int channel_alignment(Conv2dFusedArgs const& a);

// Kernel family for a device of compute capability `cc` (e.g. 90): 80 for sm80+, 70 for
// sm70..sm75, 0 when none applies.
int family_for_device(int cc);

struct Candidate {
  KernelEntry const* entry;
  long long ctas;  // threadblocks this kernel would launch for the problem
};

// Serial split-K slices for kernel `e` on `a` (1 = no split) when no profile says; see the .cpp.
int split_k_slices(Conv2dFusedArgs const& a, KernelEntry const& e, long long ctas, int num_sms);

// Whether `slices` serial split-K slices can run kernel `e` on `a` (no residual, semaphores
// fit the workspace, at least one K-iteration per slice).
bool split_k_possible(Conv2dFusedArgs const& a, KernelEntry const& e, long long ctas, int slices);

struct LaunchResult {
  KernelEntry const* kernel = nullptr;   // the kernel that ran, or null
  int split_k_slices = 1;
  cutlass::Status status = cutlass::Status::kErrorNotSupported;
  std::string why_not;                   // when kernel is null: what every candidate said
};

// Runs the best table entry that fits `a` on a device of compute capability `cc` with
// `num_sms` multiprocessors: the widest channel alignment the tensors allow first; within
// it the profile rule's kernel, then the rest by occupancy (common/tile_order.h).
// `only` (the profiler's forced kernel) restricts the choice to the entry of that name,
// and `forced_split_k` > 0 fixes its split-K slices.
// When none fits, nothing is launched and `why_not` says why (the caller falls back).
// A launch that failed returns its kernel with status kErrorInternal.
LaunchResult launch(Conv2dFusedArgs const& a, int cc, int num_sms, cudaStream_t stream,
                    char const* only = nullptr, int forced_split_k = 0);

}  // namespace conv2d_fused
}  // namespace cutlass_ops
