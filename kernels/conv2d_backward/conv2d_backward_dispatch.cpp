#include "conv2d_backward/conv2d_backward_dispatch.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/tile_order.h"

namespace cutlass_ops {
namespace conv2d_backward {

namespace {

struct Candidate {
  KernelEntry const* entry;
  long long ctas;  // threadblocks, split-K slices included
  int split_k_slices;
};

bool aligned16(void const* p) { return p == nullptr || reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// The implicit GEMM each kind runs.
struct Gemm {
  long long m, n, k;
};
Gemm gemm_of(Conv2dBackwardArgs const& a) {
  if (a.kind == ConvKind::kDgrad) {
    return {static_cast<long long>(a.N) * a.H * a.W, a.C, static_cast<long long>(a.K) * a.R * a.S};
  }
  return {a.K, static_cast<long long>(a.C) * a.R * a.S, static_cast<long long>(a.N) * a.P * a.Q};
}

long long tiles(Gemm g, KernelEntry const& e) {
  return ((g.m + e.tile_m - 1) / e.tile_m) * ((g.n + e.tile_n - 1) / e.tile_n);
}

}  // namespace

int wgrad_split_k_slices(Conv2dBackwardArgs const& a, KernelEntry const& e, int num_sms) {
  // wgrad's output (K x C*R*S) is a few tiles, its reduction (N*P*Q) long: split it so that
  // the slices fill about four CTAs per SM (these tiles' shared memory allows about that
  // on sm80/sm90), keeping >= 16 K-iterations per slice; at most 128 slices.  The float32
  // partial sums (slices x K*R*S*C) are added up by the caller's epilogue pass.
  Gemm g = gemm_of(a);
  long long output_tiles = tiles(g, e);
  long long k_iterations = (g.k + e.tile_k - 1) / e.tile_k;
  long long slices = std::min<long long>({(4LL * num_sms + output_tiles - 1) / output_tiles,
                                          k_iterations / 16, 128});
  return slices < 2 ? 1 : static_cast<int>(slices);
}

int sm90_wgrad_slices(Conv2dBackwardArgs const& a, KernelEntry const& e, int num_sms) {
  // CUTLASS 4.2's sm90 conv cannot split K: the instance splits the batch into slices of whole
  // images, one launch each, concurrently on side streams (conv2d_backward_sm90_instance.cuh).
  // About two CTAs per SM in all (these tiles' 4-stage shared memory allows two), >= 16
  // K-iterations per slice, at most one slice per image and 64 slices.
  Gemm g = gemm_of(a);
  long long output_tiles = tiles(g, e);
  long long k_iterations = (g.k + e.tile_k - 1) / e.tile_k;
  long long slices = std::min<long long>({(2LL * num_sms + output_tiles - 1) / output_tiles, k_iterations / 16,
                                          static_cast<long long>(a.N), 64});
  return slices < 2 ? 1 : static_cast<int>(slices);
}

ProfileGpu profile_gpu(char const* gpu) { return find_profile_gpu(kProfileGpus, kNumProfileGpus, gpu); }

ProfileRule const* profile_rule(Conv2dBackwardArgs const& a, int family, ProfileGpu const& gpu) {
  long long gemm_m = static_cast<long long>(a.N) * a.P * a.Q;
  return nearest_rule(kProfileRules + gpu.first, gpu.count, gemm_m, [&](ProfileRule const& r) {
    return r.kernel >= -1 && r.family == family && r.kind == a.kind && r.dtype == a.dtype && r.C == a.C &&
           r.K == a.K && r.R == a.R && r.S == a.S && r.stride == a.stride_h && a.stride_h == a.stride_w;
  });
}

ProfileRule const* profile_rule(Conv2dBackwardArgs const& a, int family, char const* gpu) {
  return profile_rule(a, family, profile_gpu(gpu));
}

bool family_90_first(Sm90Policy policy, ProfileRule const* rule90, ProfileRule const* rule80) {
  return policy == Sm90Policy::kFirst ||
         (policy == Sm90Policy::kProfiled && rule90 != nullptr && rule90->kernel >= 0 &&
          (rule80 == nullptr || rule90->runtime_ms < rule80->runtime_ms));
}

Sm90Policy sm90_policy_from_env() {
  char const* v = std::getenv("CUTLASS_OPS_SM90");
  if (v == nullptr || *v == '\0') return Sm90Policy::kProfiled;
  if (std::strcmp(v, "0") == 0) return Sm90Policy::kOff;
  if (std::strcmp(v, "1") == 0) return Sm90Policy::kFirst;
  return Sm90Policy::kProfiled;
}

bool profile_may_choose_cudnn() {
  char const* v = std::getenv("CUTLASS_OPS_CUDNN");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

namespace {

// The profile's winner (`rule`, or null) first among `candidates`, a wgrad at its measured split
// scaled to this M (wgrad's GEMM K is N*P*Q) within [1, max_slices]; then the first candidate
// whose can_implement() takes `a`, or null, each refusal appended to `why_not`.  Shared by the
// family-80 and family-90 plans.
Candidate const* first_runnable(std::vector<Candidate>& candidates, Conv2dBackwardArgs const& a,
                                ProfileRule const* rule, int forced_split_k, long long max_slices,
                                std::string& why_not) {
  if (rule != nullptr && rule->kernel >= 0) {
    auto first = std::find_if(candidates.begin(), candidates.end(),
                              [&](Candidate const& c) { return c.entry == &kKernels[rule->kernel]; });
    if (first != candidates.end()) {
      if (a.kind == ConvKind::kWgrad && forced_split_k == 0) {
        double m_ratio = double(gemm_of(a).k) / double(rule->gemm_m);
        long long slices = std::llround(rule->split_k * m_ratio);
        first->split_k_slices = static_cast<int>(std::max<long long>(1, std::min(slices, max_slices)));
      }
      std::rotate(candidates.begin(), first, first + 1);
    }
  }
  for (Candidate const& c : candidates) {
    Conv2dBackwardArgs args = a;
    args.split_k_slices = c.split_k_slices;
    cutlass::Status status = c.entry->run(args, nullptr, /*query=*/true);
    if (status == cutlass::Status::kSuccess) return &c;
    why_not += std::string(c.entry->name) + ": " + cutlassGetStatusString(status) + "; ";
  }
  return nullptr;
}

// The family-90 part of plan(): the first family-90 kernel that can run `a`, or null (why in
// `why_not`).  `rule` (its profile's, or null) puts the measured winner first.
KernelEntry const* plan_sm90(Conv2dBackwardArgs const& a, int num_sms, char const* only, int forced_split_k,
                             ProfileRule const* rule, int& slices_out, std::string& why_not) {
  Gemm g = gemm_of(a);
  std::vector<Candidate> candidates;
  for (int i = 0; i < kNumKernels; ++i) {
    KernelEntry const& e = kKernels[i];
    if (e.run == nullptr || e.kind != a.kind || e.family != 90 || e.dtype != a.dtype || e.alignment != 8) continue;
    if (only != nullptr && std::strcmp(only, e.name) != 0) continue;
    int slices = a.kind == ConvKind::kDgrad ? 1
                 : forced_split_k > 0     ? forced_split_k
                                          : sm90_wgrad_slices(a, e, num_sms);
    candidates.push_back({&e, tiles(g, e) * slices, slices});
  }
  order_by_occupancy(candidates, num_sms, g.m, g.n);
  // The measured batch slices, scaled by M, at most 64 and one per image.
  Candidate const* c = first_runnable(candidates, a, rule, forced_split_k, std::min<long long>(64, a.N), why_not);
  if (c == nullptr) return nullptr;
  slices_out = c->split_k_slices;
  return c->entry;
}

}  // namespace

Plan plan(Conv2dBackwardArgs const& a, int cc, int num_sms, char const* only, int forced_split_k,
          Sm90Policy policy, char const* gpu) {
  Plan result;
  if (cc < 80) {
    result.why_not = "no dgrad/wgrad kernels for sm" + std::to_string(cc) + " (they need sm80+)";
    return result;
  }
  void const* operand = a.kind == ConvKind::kDgrad ? a.weight : a.input;
  if (a.C % 8 != 0 || a.K % 8 != 0 || !aligned16(a.grad_output) || !aligned16(operand) ||
      !aligned16(a.output)) {
    result.why_not = "the kernels need channel counts that are multiples of 8 and 16-byte aligned tensors";
    return result;
  }
  // This GPU's rules only (none for a GPU without a profile: the default, gpu_profile.h).
  ProfileGpu const rules = only == nullptr ? profile_gpu(gpu) : ProfileGpu{"", 0, 0};
  // Family 90 (sm_90a code: sm90 only): forced by name, or where the policy and the profile
  // say so; if none of its kernels can run the problem, the family-80 plan below.
  if (cc == 90 && (only != nullptr || policy != Sm90Policy::kOff)) {
    ProfileRule const* rule90 = only == nullptr ? profile_rule(a, 90, rules) : nullptr;
    ProfileRule const* rule80 = only == nullptr ? profile_rule(a, 80, rules) : nullptr;
    if (only != nullptr || family_90_first(policy, rule90, rule80)) {
      int slices = 1;
      KernelEntry const* e = plan_sm90(a, num_sms, only, forced_split_k, rule90, slices, result.why_not);
      if (e != nullptr) {
        result.kernel = e;
        result.split_k_slices = slices;
        result.why_not.clear();
        return result;
      }
    }
  }
  bool unit_stride = a.stride_h == 1 && a.stride_w == 1;
  Gemm g = gemm_of(a);
  std::vector<Candidate> unity, strided;
  for (int i = 0; i < kNumKernels; ++i) {
    KernelEntry const& e = kKernels[i];
    if (e.run == nullptr || e.kind != a.kind || e.family != 80 || e.dtype != a.dtype || e.alignment != 8) continue;
    if (a.kind == ConvKind::kDgrad && !e.strided_dgrad && !unit_stride) continue;
    if (only != nullptr && std::strcmp(only, e.name) != 0) continue;
    int slices = a.kind == ConvKind::kDgrad ? 1
                 : forced_split_k > 0     ? forced_split_k
                                          : wgrad_split_k_slices(a, e, num_sms);
    (e.strided_dgrad ? strided : unity).push_back({&e, tiles(g, e) * slices, slices});
  }
  // Unit-stride dgrad prefers the unity-stride kernels (simpler iterators); the strided
  // ones are the fallback for it and the only choice for stride > 1.
  order_by_occupancy(unity, num_sms, g.m, g.n);
  order_by_occupancy(strided, num_sms, g.m, g.n);
  std::vector<Candidate> candidates = unity;
  candidates.insert(candidates.end(), strided.begin(), strided.end());
  ProfileRule const* rule = only == nullptr ? profile_rule(a, 80, rules) : nullptr;
  if (rule != nullptr && rule->kernel == -1 && profile_may_choose_cudnn()) {
    result.prefer_cudnn = true;
    result.why_not = "the profile measured cuDNN faster on this problem";
    return result;
  }
  if (Candidate const* c = first_runnable(candidates, a, rule, forced_split_k, 128, result.why_not)) {
    result.kernel = c->entry;
    result.split_k_slices = c->split_k_slices;
    return result;
  }
  if (result.why_not.empty()) {
    result.why_not = only != nullptr ? std::string("no kernel named ") + only +
                                           " for this kind and dtype here (a family-90 kernel runs on sm90 only)"
                                     : "no dgrad/wgrad kernel built for this dtype";
  }
  return result;
}

}  // namespace conv2d_backward
}  // namespace cutlass_ops
