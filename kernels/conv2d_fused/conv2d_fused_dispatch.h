// The dispatch table the generator writes (conv2d_fused_dispatch_table.cpp in the build
// tree), and the run-time choice of a kernel from it.  No torch here: the C++ tests use it.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "cutlass/cutlass.h"
#include "common/gpu_profile.h"
#include "conv2d_fused/conv2d_fused_args.h"

namespace cutlass_ops {
namespace conv2d_fused {

using KernelFn = cutlass::Status (*)(Conv2dFusedArgs const&, cudaStream_t);

struct KernelEntry {
  char const* name;
  int family;            // CUTLASS arch tag the kernel is written for: 70, 80 or 90 (sm_90a)
  DType dtype;
  int alignment;         // channel alignment in elements (input C and output K)
  int tile_m, tile_n, tile_k, stages;  // stages 0: the CUTLASS builder's automatic count
  KernelFn run;
  int cluster_m = 1, cluster_n = 1;    // thread block cluster (family 90)
};

extern const KernelEntry kKernels[];
extern const int kNumKernels;

// A measured winner (profiles/<gpu>/): for this problem class the kernel kKernels[kernel] with
// `split_k` serial split-K slices was fastest at GEMM M = gemm_m (= N*P*Q) on that GPU.
struct ProfileRule {
  int family;
  DType dtype;
  int alignment;
  int C, K, R, S, stride;
  long long gemm_m;
  int kernel;   // index into kKernels, -1 in an empty table
  int split_k;  // 1 = no split
  double runtime_ms;  // the winner's measured time: rules of two families compete by it
};

extern const ProfileRule kProfileRules[];
extern const int kNumProfileRules;

// The GPUs with rules, each with its slice of kProfileRules (common/gpu_profile.h).
extern const ProfileGpu kProfileGpus[];
extern const int kNumProfileGpus;

// The rules of GPU `gpu` (a profiles/ folder name; null: the current device's, looked up once
// per device).  A GPU without a profile gets none: the default choice (common/gpu_profile.h's
// find_profile_gpu says which).
ProfileGpu profile_gpu(char const* gpu = nullptr);

// The profile rule among `gpu`'s for `a` (same class, nearest M on a log scale), or null when
// none of that GPU's rules covers the problem.
ProfileRule const* profile_rule(Conv2dFusedArgs const& a, int family, int alignment, ProfileGpu const& gpu);

// Largest alignment in {8,4,2,1} that divides C and K and that every pointer honours.
int channel_alignment(Conv2dFusedArgs const& a);

// Kernel families a device of compute capability `cc` runs, in the order the dispatcher
// tries them: {90, 80} on sm90 (family 90 is sm_90a code, which runs on sm90 only), {80} on
// other sm80+, {70} on sm70..sm75, {} below.
std::vector<int> families_for_device(int cc);

// The families the automatic choice tries for a problem, in order, on a device that runs
// `device_families`: family 90 (when present) is kept per `policy` (conv2d_fused_args.h), where
// kProfiled keeps it first only when its profile rule `rule90` is faster than family 80's
// `rule80` (or family 80 has none); otherwise it is dropped.  Both rules are the running GPU's
// (profile_gpu): without a rule90 (no profile for this GPU) family 90 is dropped.
std::vector<int> families_to_try(std::vector<int> device_families, Sm90Policy policy,
                                 ProfileRule const* rule90, ProfileRule const* rule80);

// The hand-written kernels of this build (conv2d_fused_sm90_halo.h), tried before the table's.
std::vector<KernelEntry const*> const& hand_written_kernels();

struct HaloSeGateArgs;  // conv2d_fused_sm90_halo.h

// conv2d_fused_se_gate's kernel (the halo conv with se_gate as its epilogue) on a device of
// compute capability `cc`: kSuccess; kErrorInternal for a failed launch; kErrorNotSupported
// with `why_not` set when this build has no family 90, the device is not sm90, or the kernel
// does not take the problem (halo_se_gate_fits).
cutlass::Status run_halo_se_gate(HaloSeGateArgs const& a, int cc, cudaStream_t stream, std::string& why_not);

// CUTLASS_OPS_SM90_HALO (read per call): false when it is 0, i.e. the automatic choice (the
// forward's and conv2d_dgrad's) leaves the hand-written kernels out; a forced one still runs.
bool hand_written_kernels_from_env();

// The first of them (e.g. 90 for cc 90), 0 when none applies.
int family_for_device(int cc);

// Serial split-K slices a kernel can run (family 90, the CUTLASS 3.x kernels: 1).
int max_split_k(KernelEntry const& e);

// Threadblocks kernel `e` launches for `a` (a family-90 grid is a whole number of clusters).
long long kernel_ctas(Conv2dFusedArgs const& a, KernelEntry const& e);

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
// `num_sms` multiprocessors: family by family (families_for_device, then families_to_try
// unless forced), the widest channel alignment the tensors allow first; within it the
// profile rule's kernel (the running GPU's), then the rest by occupancy (common/tile_order.h).  A kernel whose
// can_implement() refuses the problem falls through to the next one, its reason recorded.
// `only` (the profiler's forced kernel) restricts the choice to the entry of that name,
// and `forced_split_k` > 0 fixes its split-K slices.
// The hand-written kernels (hand_written_kernels()) come first, unless `hand_written` is false
// (then only a forced one runs).
// When none fits, nothing is launched and `why_not` says why (the caller falls back).
// A launch that failed returns its kernel with status kErrorInternal.
// The profile rules are those of GPU `gpu` (profile_gpu(gpu); null: the current device's) only.
LaunchResult launch(Conv2dFusedArgs const& a, int cc, int num_sms, cudaStream_t stream,
                    char const* only = nullptr, int forced_split_k = 0, bool hand_written = true,
                    char const* gpu = nullptr);

}  // namespace conv2d_fused
}  // namespace cutlass_ops
