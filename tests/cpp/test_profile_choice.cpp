// Host-only (no GPU needed): the dispatchers follow the profile rules of one GPU only.
//  * gpu_slug() names a device as cutlass_ops/tools/profiler.py's gpu_slug names its profiles/
//    folder;
//  * each GPU's rules are a slice of the generated table (kProfileGpus), and a rule lookup for
//    one GPU returns that GPU's rule or none, never another GPU's;
//  * a GPU without a profile gets the default choice: no rule, so conv2d_fused keeps family 80
//    only (families_to_try) and conv2d_dgrad/wgrad never choose cuDNN by profile (plan()),
//    while a GPU whose own rule measured cuDNN fastest does.
// A build whose kernel set ignores profiles (ci) has no rules: the table checks then cover the
// default only.
#include <cstdio>
#include <string>
#include <vector>

#include "common/gpu_profile.h"
#include "conv2d_backward/conv2d_backward_dispatch.h"
#include "conv2d_fused/conv2d_fused_dispatch.h"

namespace fused = cutlass_ops::conv2d_fused;
namespace bwd = cutlass_ops::conv2d_backward;
using cutlass_ops::ProfileGpu;

namespace {

int failures = 0, checks = 0;

#define CHECK(cond)                                                       \
  do {                                                                    \
    ++checks;                                                             \
    if (!(cond)) {                                                        \
      ++failures;                                                         \
      std::printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);         \
    }                                                                     \
  } while (0)

alignas(256) char g_buffer[4096];  // never read: plan() only needs aligned pointers

char const* const kUnknownGpu = "no-such-gpu";

// Each GPU's slice lies inside the table, the slices do not overlap, and they cover it.
template <typename Rule>
void check_slices(char const* table, ProfileGpu const* gpus, int num_gpus, int num_rules) {
  int covered = 0;
  for (int i = 0; i < num_gpus; ++i) {
    CHECK(gpus[i].first == covered && gpus[i].count > 0);
    covered += gpus[i].count;
    for (int j = 0; j < i; ++j) CHECK(std::string(gpus[i].slug) != gpus[j].slug);
  }
  CHECK(covered == num_rules);
  std::printf("%s: %d rules of %d GPU(s)", table, num_rules, num_gpus);
  for (int i = 0; i < num_gpus; ++i) std::printf("%s %s (%d)", i ? "," : ":", gpus[i].slug, gpus[i].count);
  std::printf("\n");
}

bool inside(void const* rule, void const* rules, ProfileGpu const& gpu, size_t size) {
  char const* p = static_cast<char const*>(rule);
  char const* base = static_cast<char const*>(rules);
  return p >= base + gpu.first * size && p < base + (gpu.first + gpu.count) * size;
}

void check_slug() {
  using cutlass_ops::gpu_slug;
  CHECK(gpu_slug("NVIDIA H100 80GB HBM3") == "h100-80gb-hbm3");
  CHECK(gpu_slug("NVIDIA H200") == "h200");
  CHECK(gpu_slug("NVIDIA A100-SXM4-80GB") == "a100-sxm4-80gb");
  CHECK(gpu_slug("NVIDIA GeForce RTX 4090") == "geforce-rtx-4090");
  CHECK(gpu_slug("Tesla V100-SXM2-16GB") == "tesla-v100-sxm2-16gb");
  CHECK(gpu_slug("  NVIDIA  ") == "");
  CHECK(std::string(cutlass_ops::device_gpu_slug(-1)).empty());
  ProfileGpu const table[] = {{"a100-sxm4-80gb", 0, 3}, {"h200", 3, 2}};
  ProfileGpu h200 = cutlass_ops::find_profile_gpu(table, 2, "h200");
  CHECK(h200.first == 3 && h200.count == 2);
  CHECK(cutlass_ops::find_profile_gpu(table, 2, "h20").count == 0);  // whole names only
  CHECK(cutlass_ops::find_profile_gpu(table, 2, kUnknownGpu).count == 0);
  std::printf("this process's device: '%s'\n", cutlass_ops::current_gpu_slug());
}

void check_fused() {
  check_slices<fused::ProfileRule>("conv2d_fused", fused::kProfileGpus, fused::kNumProfileGpus,
                                   fused::kNumProfileRules);
  ProfileGpu const unknown = fused::profile_gpu(kUnknownGpu);
  CHECK(unknown.count == 0);
  for (int g = 0; g < fused::kNumProfileGpus; ++g) {
    ProfileGpu const gpu = fused::profile_gpu(fused::kProfileGpus[g].slug);
    CHECK(gpu.first == fused::kProfileGpus[g].first && gpu.count == fused::kProfileGpus[g].count);
    for (int i = gpu.first; i < gpu.first + gpu.count; ++i) {
      fused::ProfileRule const& r = fused::kProfileRules[i];
      fused::Conv2dFusedArgs a{};
      a.dtype = r.dtype;
      a.N = static_cast<int>(r.gemm_m); a.P = a.Q = 1;  // the rules see M = N*P*Q
      a.C = r.C; a.K = r.K; a.R = r.R; a.S = r.S; a.stride_h = a.stride_w = r.stride;
      // This GPU's lookup finds this GPU's rule for the problem; every other GPU's lookup
      // finds its own rule or none.
      fused::ProfileRule const* mine = fused::profile_rule(a, r.family, r.alignment, gpu);
      CHECK(mine != nullptr && inside(mine, fused::kProfileRules, gpu, sizeof r) && mine->gemm_m == r.gemm_m);
      for (int h = 0; h < fused::kNumProfileGpus; ++h) {
        fused::ProfileRule const* other = fused::profile_rule(a, r.family, r.alignment, fused::kProfileGpus[h]);
        CHECK(other == nullptr || inside(other, fused::kProfileRules, fused::kProfileGpus[h], sizeof r));
      }
      // The default: no rule, so family 90 is dropped and family 80 keeps its occupancy order.
      fused::ProfileRule const* none90 = fused::profile_rule(a, 90, 8, unknown);
      fused::ProfileRule const* none80 = fused::profile_rule(a, 80, 8, unknown);
      CHECK(none90 == nullptr && none80 == nullptr);
      CHECK(fused::families_to_try({90, 80}, fused::Sm90Policy::kProfiled, none90, none80) == std::vector<int>{80});
    }
  }
  CHECK(fused::families_to_try({90, 80}, fused::Sm90Policy::kProfiled, nullptr, nullptr) == std::vector<int>{80});
  CHECK(fused::families_to_try({90, 80}, fused::Sm90Policy::kFirst, nullptr, nullptr) == (std::vector<int>{90, 80}));
}

bwd::Conv2dBackwardArgs backward_args(bwd::ProfileRule const& r) {
  bwd::Conv2dBackwardArgs a{};
  a.kind = r.kind;
  a.dtype = r.dtype;
  // One output pixel per image, so that N*P*Q = the rule's M: a 1x1 map, padded to keep it.
  a.N = static_cast<int>(r.gemm_m); a.H = a.W = r.stride; a.P = a.Q = 1;
  a.C = r.C; a.K = r.K; a.R = r.R; a.S = r.S;
  a.pad_h = a.pad_w = r.R / 2;
  a.stride_h = a.stride_w = r.stride;
  a.grad_output = a.weight = a.input = g_buffer;
  a.output = g_buffer;
  return a;
}

void check_backward() {
  check_slices<bwd::ProfileRule>("conv2d_backward", bwd::kProfileGpus, bwd::kNumProfileGpus,
                                 bwd::kNumProfileRules);
  ProfileGpu const unknown = bwd::profile_gpu(kUnknownGpu);
  CHECK(unknown.count == 0);
  int cudnn_rules = 0;
  for (int g = 0; g < bwd::kNumProfileGpus; ++g) {
    ProfileGpu const gpu = bwd::kProfileGpus[g];
    for (int i = gpu.first; i < gpu.first + gpu.count; ++i) {
      bwd::ProfileRule const& r = bwd::kProfileRules[i];
      bwd::Conv2dBackwardArgs const a = backward_args(r);
      bwd::ProfileRule const* mine = bwd::profile_rule(a, r.family, gpu);
      CHECK(mine != nullptr && inside(mine, bwd::kProfileRules, gpu, sizeof r) && mine->gemm_m == r.gemm_m);
      CHECK(bwd::profile_rule(a, r.family, gpu.slug) == mine);
      CHECK(bwd::profile_rule(a, r.family, unknown) == nullptr);
      // Family 90 first on sm90 only by this GPU's own rules; never without a profile.
      CHECK(!bwd::family_90_first(bwd::Sm90Policy::kProfiled, bwd::profile_rule(a, 90, unknown),
                                  bwd::profile_rule(a, 80, unknown)));
      if (r.family != 80) continue;
      // cuDNN by profile: on sm80 (family 80 only) a GPU goes to cuDNN exactly where its own
      // rule says so; the default (unknown GPU) never does.
      for (int h = 0; h < bwd::kNumProfileGpus; ++h) {
        bwd::ProfileRule const* own = bwd::profile_rule(a, 80, bwd::kProfileGpus[h]);
        bool const wants_cudnn = own != nullptr && own->kernel == -1;
        bwd::Plan const p = bwd::plan(a, 80, 108, nullptr, 0, bwd::Sm90Policy::kProfiled, bwd::kProfileGpus[h].slug);
        CHECK(p.prefer_cudnn == wants_cudnn);
      }
      bwd::Plan const p = bwd::plan(a, 90, 132, nullptr, 0, bwd::Sm90Policy::kProfiled, kUnknownGpu);
      CHECK(!p.prefer_cudnn && (p.kernel == nullptr || p.kernel->family == 80));
      cudnn_rules += r.kernel == -1;
    }
  }
  std::printf("conv2d_backward: %d rules choose cuDNN (for their GPU only)\n", cudnn_rules);
  CHECK(!bwd::family_90_first(bwd::Sm90Policy::kProfiled, nullptr, nullptr));
  CHECK(bwd::family_90_first(bwd::Sm90Policy::kFirst, nullptr, nullptr));
  CHECK(!bwd::family_90_first(bwd::Sm90Policy::kOff, nullptr, nullptr));
}

}  // namespace

int main() {
  check_slug();
  check_fused();
  check_backward();
  std::printf("%d of %d checks failed\n", failures, checks);
  return failures == 0 ? 0 : 1;
}
