// Host-only check of the conv2d_backward dispatcher with the family-90 (sm_90a) dgrad/wgrad kernels
// of a CUTLASS_OPS_SM90_BACKWARD=1 build.  plan() asks each candidate kernel's can_implement()
// (query: no CUDA call, no GPU), so this runs anywhere: on FusedResNet's training convs (and an odd
// one) at N = 1, 512, 2048 it checks that with CUTLASS_OPS_SM90=1 (kFirst) on sm90 every
// unity-stride dgrad and every wgrad plans a family-90 kernel, a strided dgrad never does (CUTLASS
// 4.2's sm90 dgrad is unity-stride only), the default policy without an sm90 profile rule, the
// off policy and an sm80 device never do; and that a forced family-90 kernel refuses what it
// cannot run (more batch slices than images, stride 2 for dgrad, a non-sm90 device).
// Exit 77 (ctest: skipped) when the build has no family-90 backward kernels.
#include <cstdio>
#include <string>

#include "conv2d_backward/conv2d_backward_dispatch.h"

using namespace cutlass_ops::conv2d_backward;

namespace {

alignas(256) char g_buffer[4096];  // never read: plan() only needs 16-byte aligned pointers

Conv2dBackwardArgs make(ConvKind kind, DType dtype, int n, int c, int h, int k, int r, int stride, int pad) {
  Conv2dBackwardArgs a{};
  a.kind = kind;
  a.dtype = dtype;
  a.N = n; a.H = h; a.W = h; a.C = c; a.K = k; a.R = r; a.S = r;
  a.P = (h + 2 * pad - r) / stride + 1;
  a.Q = a.P;
  a.pad_h = a.pad_w = pad;
  a.stride_h = a.stride_w = stride;
  a.grad_output = a.weight = a.input = g_buffer;
  a.output = g_buffer;
  return a;
}

bool family90(Plan const& p) { return p.kernel != nullptr && p.kernel->family == 90; }

}  // namespace

int main() {
  bool any = false;
  bool dtypes[2] = {false, false};
  for (int i = 0; i < kNumKernels; ++i) {
    if (kKernels[i].run != nullptr && kKernels[i].family == 90) {
      any = true;
      dtypes[kKernels[i].dtype == DType::kF16 ? 0 : 1] = true;
    }
  }
  if (!any) {
    std::printf("no family-90 dgrad/wgrad kernels in this build (CUTLASS_OPS_SM90_BACKWARD=1): skipped\n");
    return 77;
  }
  struct Problem { int c, h, k, r, stride, pad; };
  Problem const problems[] = {
      {64, 16, 64, 3, 1, 1},  {64, 16, 128, 3, 2, 1}, {128, 8, 128, 3, 1, 1}, {64, 8, 128, 1, 1, 0},
      {128, 8, 256, 3, 2, 1}, {256, 4, 256, 3, 1, 1}, {128, 4, 256, 1, 1, 0}, {256, 4, 512, 3, 2, 1},
      {512, 2, 512, 3, 1, 1}, {256, 2, 512, 1, 1, 0}, {2048, 1, 2048, 1, 1, 0}, {24, 9, 40, 3, 1, 1},
  };
  int failures = 0, checked = 0;
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    if (!dtypes[dtype == DType::kF16 ? 0 : 1]) continue;
    for (int n : {1, 512, 2048}) {
      for (Problem const& p : problems) {
        for (ConvKind kind : {ConvKind::kDgrad, ConvKind::kWgrad}) {
          Conv2dBackwardArgs a = make(kind, dtype, n, p.c, p.h, p.k, p.r, p.stride, p.pad);
          Plan first = plan(a, 90, 132, nullptr, 0, Sm90Policy::kFirst);
          bool const want90 = kind == ConvKind::kWgrad || p.stride == 1;
          bool ok = family90(first) == want90 && !family90(plan(a, 90, 132, nullptr, 0, Sm90Policy::kOff)) &&
                    !family90(plan(a, 80, 108, nullptr, 0, Sm90Policy::kFirst));
          // (The default policy runs family 90 only where an sm90.csv rule says it is faster.)
          ProfileRule const* rule90 = profile_rule(a, 90);
          if (rule90 == nullptr) ok = ok && !family90(plan(a, 90, 132, nullptr, 0, Sm90Policy::kProfiled));
          if (family90(first) && kind == ConvKind::kWgrad) ok = ok && first.split_k_slices >= 1 && first.split_k_slices <= n;
          ++checked;
          if (!ok) {
            ++failures;
            std::printf("FAIL %s %s N=%d %d->%d %dx%d %dx%d/%d: %s (%s)\n", kind == ConvKind::kDgrad ? "dgrad" : "wgrad",
                        dtype == DType::kF16 ? "f16" : "bf16", n, p.c, p.k, p.h, p.h, p.r, p.r, p.stride,
                        first.kernel ? first.kernel->name : "none", first.why_not.c_str());
          } else if (n == 2048 && dtype == DType::kF16) {
            std::printf("ok   %s N=%d %d->%d %dx%d %dx%d/%d: %s, %d slice(s)\n", kind == ConvKind::kDgrad ? "dgrad" : "wgrad",
                        n, p.c, p.k, p.h, p.h, p.r, p.r, p.stride, first.kernel ? first.kernel->name : "cuDNN",
                        first.split_k_slices);
          }
        }
      }
    }
  }
  for (int i = 0; i < kNumKernels; ++i) {
    KernelEntry const& e = kKernels[i];
    if (e.run == nullptr || e.family != 90) continue;
    bool const wgrad = e.kind == ConvKind::kWgrad;
    Conv2dBackwardArgs a = make(e.kind, e.dtype, 4, 64, 16, 64, 3, 1, 1);
    Plan fits = plan(a, 90, 132, e.name, wgrad ? 4 : 0);
    Plan too_many = plan(a, 90, 132, e.name, 5);  // 5 slices of 4 images (dgrad ignores the split)
    Plan strided = plan(make(e.kind, e.dtype, 4, 64, 16, 128, 3, 2, 1), 90, 132, e.name, 0);
    Plan on_sm80 = plan(a, 80, 108, e.name, 0);
    bool ok = fits.kernel == &e && (fits.split_k_slices == (wgrad ? 4 : 1)) &&
              (wgrad ? too_many.kernel == nullptr : too_many.kernel == &e) &&
              (wgrad ? strided.kernel == &e : strided.kernel == nullptr) && on_sm80.kernel == nullptr;
    ++checked;
    if (!ok) ++failures;
    std::printf("%s forced %s: fits %d, 5 slices of 4 images %s, stride 2 %s, on sm80 %s\n", ok ? "ok  " : "FAIL",
                e.name, fits.kernel == &e, too_many.kernel ? "runs" : "refused", strided.kernel ? "runs" : "refused",
                on_sm80.kernel ? "runs" : "refused");
  }
  std::printf("%d of %d checks failed\n", failures, checked);
  return failures == 0 ? 0 : 1;
}
