#include "conv2d_fused/conv2d_fused_dispatch.h"

#include <cstdint>

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

int family_for_device(int cc) {
  if (cc >= 80) return 80;
  if (cc >= 70) return 70;
  return 0;
}

LaunchResult launch(Conv2dFusedArgs const& a, int cc, cudaStream_t stream) {
  LaunchResult result;
  int family = family_for_device(cc);
  int max_align = channel_alignment(a);
  // Any alignment that divides the widest one also fits, so a build without (say) the
  // alignment-4 kernels still runs C=12 through the alignment-2 or -1 kernels.
  for (int align = max_align; align >= 1; align /= 2) {
    for (int i = 0; i < kNumKernels; ++i) {
      KernelEntry const& e = kKernels[i];
      if (e.run == nullptr || e.family != family || e.dtype != a.dtype || e.alignment != align) continue;
      if (e.max_out_channels != 0 && a.K > e.max_out_channels) continue;
      cutlass::Status status = e.run(a, stream);
      // kErrorInternal is a failed launch, not a kernel that does not fit: report it.
      if (status == cutlass::Status::kSuccess || status == cutlass::Status::kErrorInternal) {
        result.kernel = &e;
        result.status = status;
        return result;
      }
      result.status = status;
      result.why_not += std::string(e.name) + ": " + cutlassGetStatusString(status) + "; ";
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
