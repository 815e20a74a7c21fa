#include "conv2d_fused/conv2d_fused_dispatch.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/tile_order.h"
#include "conv2d_fused/conv2d_fused_sm90_halo.h"

namespace cutlass_ops {
namespace conv2d_fused {

namespace {
int element_bytes(DType) { return 2; }  // f16 and bf16

bool aligned(void const* p, int bytes) {
  return p == nullptr || reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}
}  // namespace

int channel_alignment(Conv2dFusedArgs const& a) {
  for (int align : {8, 4, 2}) {
    int bytes = align * element_bytes(a.dtype);
    if (a.C % align == 0 && a.K % align == 0 && aligned(a.input, bytes) &&
        aligned(a.weight, bytes) && aligned(a.output, bytes) && aligned(a.residual, bytes) &&
        aligned(a.bias, align * 4)) {
      return align;
    }
  }
  return 1;
}

namespace {
long long k_iterations(Conv2dFusedArgs const& a, KernelEntry const& e) {
  return (static_cast<long long>(a.R) * a.S * a.C + e.tile_k - 1) / e.tile_k;
}
}  // namespace

int max_split_k(KernelEntry const& e) {
  // The CUTLASS 3.x conv kernel (non-persistent, no stream-K scheduler) has no split-K.
  return e.family == 90 ? 1 : 64;
}

long long kernel_ctas(Conv2dFusedArgs const& a, KernelEntry const& e) {
  long long gemm_m = static_cast<long long>(a.N) * a.P * a.Q;
  long long tiles_m = (gemm_m + e.tile_m - 1) / e.tile_m, tiles_n = (a.K + e.tile_n - 1) / e.tile_n;
  auto whole_clusters = [](long long tiles, int cluster) { return (tiles + cluster - 1) / cluster * cluster; };
  return whole_clusters(tiles_m, e.cluster_m) * whole_clusters(tiles_n, e.cluster_n);
}

bool split_k_possible(Conv2dFusedArgs const& a, KernelEntry const& e, long long ctas, int slices) {
  // The epilogue's source slot carries the partial sums, so no residual; one semaphore
  // (int) per output tile.
  return slices == 1 || (slices > 1 && slices <= max_split_k(e) && a.residual == nullptr &&
                         slices <= k_iterations(a, e) &&
                         static_cast<size_t>(ctas) * sizeof(int) <= a.workspace_bytes);
}

int split_k_slices(Conv2dFusedArgs const& a, KernelEntry const& e, long long ctas, int num_sms) {
  // Split only when the output tiles leave SMs idle, and keep >= 4 K-iterations per slice.
  // At most 8 slices: serial split-K runs the slices' epilogues one after another, and the
  // H200 sweep (profiles/h200) never found more than 4 slices fastest.
  if (ctas >= num_sms) return 1;
  long long slices = std::min<long long>({num_sms / ctas, k_iterations(a, e) / 4, 8});
  if (slices < 2 || !split_k_possible(a, e, ctas, static_cast<int>(slices))) return 1;
  return static_cast<int>(slices);
}

std::vector<int> families_for_device(int cc) {
  if (cc == 90) return {90, 80};
  if (cc >= 80) return {80};
  if (cc >= 70) return {70};
  return {};
}

std::vector<int> families_to_try(std::vector<int> families, Sm90Policy policy,
                                 ProfileRule const* rule90, ProfileRule const* rule80) {
  bool keep90 = policy == Sm90Policy::kFirst ||
                (policy == Sm90Policy::kProfiled && rule90 != nullptr &&
                 (rule80 == nullptr || rule90->runtime_ms < rule80->runtime_ms));
  if (!keep90) families.erase(std::remove(families.begin(), families.end(), 90), families.end());
  return families;
}

std::vector<KernelEntry const*> const& hand_written_kernels() {
  static std::vector<KernelEntry const*> const kernels = [] {
    std::vector<KernelEntry const*> list;
#if CUTLASS_OPS_HAVE_SM90_HALO
    for (int i = 0; i < kNumHaloKernels; ++i) list.push_back(&kHaloKernels[i]);
#endif
    return list;
  }();
  return kernels;
}

cutlass::Status run_halo_se_gate(HaloSeGateArgs const& a, int cc, cudaStream_t stream, std::string& why_not) {
#if CUTLASS_OPS_HAVE_SM90_HALO
  if (cc != 90) {
    why_not = "the kernel is sm_90a code and this GPU is sm" + std::to_string(cc);
    return cutlass::Status::kErrorNotSupported;
  }
  if (!halo_se_gate_fits(a)) {
    why_not = "the kernel takes 16x16 maps, C = K = 64, 1-16 hidden units, 16-byte aligned maps";
    return cutlass::Status::kErrorNotSupported;
  }
  cutlass::Status const status = sm90_halo::run_se_gate(a, stream);
  if (status == cutlass::Status::kErrorNotSupported) why_not = "the TMA descriptors could not be made";
  return status;
#else
  (void)a, (void)cc, (void)stream;
  why_not = "this build has no family-90 kernels (CUTLASS_OPS_ARCHS without 90)";
  return cutlass::Status::kErrorNotSupported;
#endif
}

bool hand_written_kernels_from_env() {
  char const* env = std::getenv("CUTLASS_OPS_SM90_HALO");
  return env == nullptr || env[0] != '0';
}

int family_for_device(int cc) {
  std::vector<int> families = families_for_device(cc);
  return families.empty() ? 0 : families.front();
}

ProfileGpu profile_gpu(char const* gpu) { return find_profile_gpu(kProfileGpus, kNumProfileGpus, gpu); }

ProfileRule const* profile_rule(Conv2dFusedArgs const& a, int family, int alignment, ProfileGpu const& gpu) {
  long long gemm_m = static_cast<long long>(a.N) * a.P * a.Q;
  return nearest_rule(kProfileRules + gpu.first, gpu.count, gemm_m, [&](ProfileRule const& r) {
    return r.kernel >= 0 && r.family == family && r.dtype == a.dtype && r.alignment == alignment && r.C == a.C &&
           r.K == a.K && r.R == a.R && r.S == a.S && r.stride == a.stride_h && a.stride_h == a.stride_w;
  });
}

LaunchResult launch(Conv2dFusedArgs const& a, int cc, int num_sms, cudaStream_t stream,
                    char const* only, int forced_split_k, bool hand_written, char const* gpu) {
  LaunchResult result;
  int max_align = channel_alignment(a);
  long long const gemm_m = static_cast<long long>(a.N) * a.P * a.Q;
  std::vector<int> families = families_for_device(cc);
  // This GPU's rules only (none for a GPU without a profile: the default, gpu_profile.h).
  ProfileGpu const rules = profile_gpu(gpu);
  // A forced kernel runs whatever its family; otherwise the policy and the profile decide
  // (family 90 has alignment-8 kernels only).
  if (only == nullptr)
    families = families_to_try(families, a.act == Activation::kSilu ? Sm90Policy::kNever : a.sm90_policy,
                               profile_rule(a, 90, 8, rules), profile_rule(a, 80, 8, rules));
  // The hand-written kernels first: each covers one problem class, where it measured faster
  // than every generated kernel and cuDNN (conv2d_fused_sm90_halo.cu), and refuses the rest.
  // Under the automatic choice they follow the family-90 policy (not with CUTLASS_OPS_SM90=0)
  // and the caller's `hand_written` (CUTLASS_OPS_SM90_HALO=0: off).
  std::vector<int> const device_families = families_for_device(cc);
  for (KernelEntry const* e : hand_written_kernels()) {
    bool const device_runs =
        std::find(device_families.begin(), device_families.end(), e->family) != device_families.end();
    bool const wanted = only != nullptr ? std::strcmp(only, e->name) == 0
                                        : hand_written && a.sm90_policy != Sm90Policy::kNever &&
                                              a.act != Activation::kSilu;
    if (!device_runs || !wanted || e->dtype != a.dtype || forced_split_k > 1) continue;
    cutlass::Status status = e->run(a, stream);
    if (status == cutlass::Status::kSuccess || status == cutlass::Status::kErrorInternal) {
      result.kernel = e;
      result.status = status;
      return result;
    }
    result.status = status;
    result.why_not += std::string(e->name) + ": " + cutlassGetStatusString(status) + "; ";
  }
  for (int family : families) {
    // Any alignment that divides the widest one also fits, so a build without (say) the
    // alignment-4 kernels still runs C=12 through the alignment-2 or -1 kernels.
    for (int align = max_align; align >= 1; align /= 2) {
      std::vector<Candidate> candidates;
      for (int i = 0; i < kNumKernels; ++i) {
        KernelEntry const& e = kKernels[i];
        if (e.run == nullptr || e.family != family || e.dtype != a.dtype || e.alignment != align) continue;
        if (only != nullptr && std::strcmp(only, e.name) != 0) continue;
        if (e.family == 90 && a.act == Activation::kSilu) {  // no SiLU epilogue in family 90
          result.why_not += std::string(e.name) + ": family-90 kernels have no SiLU epilogue; ";
          continue;
        }
        candidates.push_back({&e, kernel_ctas(a, e)});
      }
      order_by_occupancy(candidates, num_sms, gemm_m, a.K);
      ProfileRule const* rule = profile_rule(a, family, align, rules);
      if (rule != nullptr) {  // the measured winner first, the rest keep their order
        auto first = std::find_if(candidates.begin(), candidates.end(),
                                  [&](Candidate const& c) { return c.entry == &kKernels[rule->kernel]; });
        if (first != candidates.end()) std::rotate(candidates.begin(), first, first + 1);
      }
      for (Candidate const& c : candidates) {
        Conv2dFusedArgs args = a;
        if (forced_split_k > 0) {
          if (!split_k_possible(a, *c.entry, c.ctas, forced_split_k)) {
            result.why_not += std::string(c.entry->name) + ": cannot split K " +
                              std::to_string(forced_split_k) + " ways here; ";
            continue;
          }
          args.split_k_slices = forced_split_k;
        } else if (rule != nullptr && c.entry == &kKernels[rule->kernel] && c.ctas < num_sms &&
                   split_k_possible(a, *c.entry, c.ctas, rule->split_k)) {
          args.split_k_slices = rule->split_k;  // measured (the rule's M is the nearest)
        } else {
          args.split_k_slices = split_k_slices(a, *c.entry, c.ctas, num_sms);
        }
        cutlass::Status status = c.entry->run(args, stream);
        // kErrorInternal is a failed launch, not a kernel that does not fit: report it.
        if (status == cutlass::Status::kSuccess || status == cutlass::Status::kErrorInternal) {
          result.kernel = c.entry;
          result.status = status;
          result.split_k_slices = args.split_k_slices;
          return result;
        }
        result.status = status;
        result.why_not += std::string(c.entry->name) + ": " + cutlassGetStatusString(status) + "; ";
      }
    }
  }
  if (result.why_not.empty()) {
    std::string names;
    for (int family : families) names += (names.empty() ? "" : ", ") + std::to_string(family);
    result.why_not = "no kernel built for sm" + std::to_string(cc) + " (families " +
                     (names.empty() ? "none" : names) + ") with this dtype and a channel alignment <= " +
                     std::to_string(max_align);
  }
  return result;
}

}  // namespace conv2d_fused
}  // namespace cutlass_ops
