#include "conv2d_fused/conv2d_fused_dispatch.h"

#include <algorithm>
#include <cstdint>
#include <vector>

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

void order_by_occupancy(std::vector<Candidate>& candidates, int num_sms) {
  // Tiles that give every SM a CTA first, largest tile first (fewer re-reads of A and B);
  // then the rest, most CTAs first.  Stable: equal tiles keep the table's (profile) order.
  std::stable_sort(candidates.begin(), candidates.end(), [num_sms](Candidate const& x, Candidate const& y) {
    bool fx = x.ctas >= num_sms, fy = y.ctas >= num_sms;
    if (fx != fy) return fx;
    if (fx) return x.entry->tile_m * x.entry->tile_n > y.entry->tile_m * y.entry->tile_n;
    return x.ctas > y.ctas;
  });
}

int split_k_slices(Conv2dFusedArgs const& a, KernelEntry const& e, long long ctas, int num_sms) {
  // Split only when the output tiles leave SMs idle, never with a residual (the epilogue's
  // source slot carries the partial sums), and keep >= 4 K-iterations per slice.
  if (a.residual != nullptr || ctas >= num_sms) return 1;
  long long k_iterations = (static_cast<long long>(a.R) * a.S * a.C + e.tile_k - 1) / e.tile_k;
  long long slices = std::min<long long>({num_sms / ctas, k_iterations / 4, 16});
  if (slices < 2 || static_cast<size_t>(ctas) * sizeof(int) > a.workspace_bytes) return 1;
  return static_cast<int>(slices);
}

int family_for_device(int cc) {
  if (cc >= 80) return 80;
  if (cc >= 70) return 70;
  return 0;
}

LaunchResult launch(Conv2dFusedArgs const& a, int cc, int num_sms, cudaStream_t stream) {
  LaunchResult result;
  int family = family_for_device(cc);
  int max_align = channel_alignment(a);
  long long const gemm_m = static_cast<long long>(a.N) * a.P * a.Q;
  // Any alignment that divides the widest one also fits, so a build without (say) the
  // alignment-4 kernels still runs C=12 through the alignment-2 or -1 kernels.
  for (int align = max_align; align >= 1; align /= 2) {
    std::vector<Candidate> candidates;
    for (int i = 0; i < kNumKernels; ++i) {
      KernelEntry const& e = kKernels[i];
      if (e.run == nullptr || e.family != family || e.dtype != a.dtype || e.alignment != align) continue;
      if (e.max_out_channels != 0 && a.K > e.max_out_channels) continue;
      long long ctas = ((gemm_m + e.tile_m - 1) / e.tile_m) * ((a.K + e.tile_n - 1) / e.tile_n);
      candidates.push_back({&e, ctas});
    }
    order_by_occupancy(candidates, num_sms);
    for (Candidate const& c : candidates) {
      Conv2dFusedArgs args = a;
      args.split_k_slices = split_k_slices(a, *c.entry, c.ctas, num_sms);
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
  if (result.why_not.empty()) {
    result.why_not = "no kernel built for sm" + std::to_string(cc) + " (family " +
                     std::to_string(family) + ") with this dtype and a channel alignment <= " +
                     std::to_string(max_align);
  }
  return result;
}

}  // namespace conv2d_fused
}  // namespace cutlass_ops
