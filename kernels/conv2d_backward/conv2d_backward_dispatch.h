// The dgrad/wgrad kernel table the generator writes (conv2d_backward_dispatch_table.cpp in
// the build tree), and the run-time choice from it.  No torch here.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "cutlass/cutlass.h"
#include "common/gpu_profile.h"
#include "conv2d_backward/conv2d_backward_args.h"

namespace cutlass_ops {
namespace conv2d_backward {

// query = true: only whether the kernel can run the problem (CUTLASS's can_implement).
using KernelFn = cutlass::Status (*)(Conv2dBackwardArgs const&, cudaStream_t, bool query);

struct KernelEntry {
  char const* name;
  ConvKind kind;
  int family;            // CUTLASS arch tag the kernel is written for: 80, or 90 (sm_90a, CUTLASS 3.x;
                         // built with CUTLASS_OPS_SM90_BACKWARD=1)
  DType dtype;
  int alignment;         // channel alignment in elements (C and K)
  bool strided_dgrad;    // dgrad: the strided kernel (any stride); else unity stride only (family 90: always)
  int tile_m, tile_n, tile_k, stages;
  KernelFn run;
};

extern const KernelEntry kKernels[];
extern const int kNumKernels;

// A measured winner (profiles/<gpu>/, `python -m cutlass_ops profile --backward`): for this
// problem class kKernels[kernel] with `split_k` slices was fastest at M = gemm_m (N*P*Q) on
// that GPU, or, with kernel == -1, cuDNN was (the op then takes its ATen path).  Profiled at
// the op level: a wgrad row includes the epilogue pass over its slices.  `family` is the
// profile's (sm80.csv: family 80 and cuDNN; sm90.csv: family 90): on sm90 the two families'
// rules of one GPU for a problem compete by runtime_ms.
struct ProfileRule {
  ConvKind kind;
  DType dtype;
  int C, K, R, S, stride;
  long long gemm_m;
  int kernel;   // index into kKernels; -1: cuDNN; -2 in an empty table
  int split_k;  // wgrad: parallel split-K slices (family 90: batch slices)
  int family;
  double runtime_ms;
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

struct Plan {
  KernelEntry const* kernel = nullptr;  // null: no kernel fits, or cuDNN is faster (the caller falls back)
  int split_k_slices = 1;               // wgrad: parallel split-K slices
  bool prefer_cudnn = false;            // kernel is null by choice (a profile rule, or forced)
  std::string why_not;                  // when kernel is null
};

// The profile rule for `a` from `family`'s profile of GPU `gpu` (same kind, dtype and class,
// nearest M on a log scale), or null.  The second form: GPU by name (null: the current device).
ProfileRule const* profile_rule(Conv2dBackwardArgs const& a, int family, ProfileGpu const& gpu);
ProfileRule const* profile_rule(Conv2dBackwardArgs const& a, int family = 80, char const* gpu = nullptr);

// Whether family 90 may run on this call's device (CUTLASS_OPS_SM90, read per call, as for
// conv2d_fused): kOff ("0"): never; kFirst ("1"): first wherever it can run; kProfiled
// (unset, default): where its profile rule (sm90.csv) is faster than family 80's or cuDNN's
// (sm80.csv) of the same GPU for the problem, never without one.
enum class Sm90Policy { kOff, kFirst, kProfiled };
Sm90Policy sm90_policy_from_env();

// Whether plan() tries family 90 first on an sm90 device (not forced): per `policy`, where
// kProfiled needs the GPU's family-90 rule `rule90` to name a kernel and to be faster than its
// family-80 (or cuDNN) rule `rule80`, or family 80 to have none.  Without a rule90 (no profile
// for this GPU): no.
bool family_90_first(Sm90Policy policy, ProfileRule const* rule90, ProfileRule const* rule80);

// Whether a profile rule that measured cuDNN fastest sends the problem to cuDNN (the default),
// or is ignored so that our kernels run wherever one can (CUTLASS_OPS_CUDNN=0, read per call:
// compute-sanitizer's initcheck does not see the stores of cuDNN's sm90 kernels, so its run
// keeps them out; see tests/gpu_sanitize.sh).  Where no kernel fits, cuDNN runs either way.
bool profile_may_choose_cudnn();

// The kernel (and for wgrad the split-K slices) for `a` on a device of compute capability
// `cc` with `num_sms` multiprocessors.  Pointers must be set or null (their alignment
// counts); a.split_k_slices is ignored.  The profile rule's kernel (and split, scaled by
// M for wgrad) first, then the rest by occupancy.  `only` (the profiler's forced kernel)
// restricts the choice to the entry of that name (rules ignored; a family-90 kernel runs only
// on sm90), and `forced_split_k` > 0 fixes wgrad's slices.  On sm90 (cc == 90) the family-90
// kernels of a build with them go first where `policy` says so (see Sm90Policy), then the
// family-80 plan as without them.  The profile rules are GPU `gpu`'s (profile_gpu(gpu); null:
// the current device's) only.
Plan plan(Conv2dBackwardArgs const& a, int cc, int num_sms, char const* only = nullptr, int forced_split_k = 0,
          Sm90Policy policy = Sm90Policy::kProfiled, char const* gpu = nullptr);

// Family-90 wgrad: batch slices for tile `e` (1..min(N, 64)), see the .cpp.
int sm90_wgrad_slices(Conv2dBackwardArgs const& a, KernelEntry const& e, int num_sms);

// Parallel split-K slices for wgrad with tile `e` (1 = no split), see the .cpp.
int wgrad_split_k_slices(Conv2dBackwardArgs const& a, KernelEntry const& e, int num_sms);

}  // namespace conv2d_backward
}  // namespace cutlass_ops
