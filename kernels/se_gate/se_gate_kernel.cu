#include "se_gate/se_gate_kernel.h"

#include <algorithm>

#include "common/dynamic_smem.h"
#include "common/programmatic_launch.cuh"
#include "se_gate/se_gate_device.cuh"

namespace cutlass_ops {
namespace se_gate {

namespace {

template <typename T, int kImages>
cudaError_t launch_typed(SeGateArgs const& a, cudaStream_t stream) {
  size_t smem = se_gate_smem_bytes(a.C, a.R, kImages, a.stage_w2, a.H * a.W, a.cache_maps);
  unsigned grid = static_cast<unsigned>((a.N + kImages - 1) / kImages);
  if (cudaError_t err = allow_dynamic_smem(se_gate_kernel<T, kImages>, smem); err != cudaSuccess) return err;
  return launch_kernel<se_gate_kernel<T, kImages>>(grid, kThreads, smem, stream,
                                                   a.programmatic_launch, a);
}

template <int kImages>
cudaError_t launch_images(SeGateArgs const& a, cudaStream_t stream) {
  return a.dtype == DType::kF16 ? launch_typed<__half, kImages>(a, stream)
                                : launch_typed<__nv_bfloat16, kImages>(a, stream);
}

}  // namespace

size_t se_gate_smem_bytes(int C, int R, int images_per_cta, bool stage_w2, int HW, bool cache_maps) {
  return sizeof(float) * SmemLayout(C, R, images_per_cta, stage_w2, HW, cache_maps).total;
}

int se_gate_max_channels() { return kThreads * kVec; }

SeGateShape se_gate_shape(int N, int H, int W, int C, int R, int num_sms, size_t max_smem_bytes,
                          size_t smem_per_sm, size_t l2_bytes) {
  SeGateShape shape;
  shape.stage_w2 = se_gate_smem_bytes(C, R, 1, true) <= max_smem_bytes;
  // Group images while a group has at most four 8-channel vectors per thread (few pixels,
  // many channels: reading the excite weights then dominates), while every SM still gets a
  // CTA and shared memory allows.  (H100, N = 512 and 2048: the best of 1-8 images for each
  // of FusedResNet's four SE shapes, 10-20% faster than two CTAs per SM had been for C >= 128.)
  int const vectors_per_image = H * W * C / kVec;
  int& images = shape.images_per_cta;
  while (images < kMaxImagesPerCta && 2 * images * vectors_per_image <= 4 * kThreads &&
         N / (2 * images) >= num_sms &&
         se_gate_smem_bytes(C, R, 2 * images, shape.stage_w2) <= max_smem_bytes) {
    images *= 2;
  }
  // Cache the maps when h is too big to stay in L2 for its second read (at least half of
  // L2) and two CTAs still fit an SM (the launch bounds' two; 1 KB a CTA is the system's).
  // H100, FusedResNet's SE gates: at N=2048 16x16x64 (h 67 MB) cached took 0.091
  // ms against 0.112, 8x8x128 (34 MB) 0.062 against 0.065, but 4x4x256 (17 MB) 0.043 against
  // 0.041, and at N=128 (4 MB and less) cached was 0-5% slower.
  size_t const two_ctas = smem_per_sm / 2 > 1024 ? smem_per_sm / 2 - 1024 : 0;
  double const h_bytes = 2.0 * N * H * W * C;
  shape.cache_fits = se_gate_smem_bytes(C, R, images, shape.stage_w2, H * W, true) <= std::min(two_ctas, max_smem_bytes);
  shape.cache_maps = shape.cache_fits && h_bytes >= 0.5 * l2_bytes;
  return shape;
}

cudaError_t launch_se_gate(SeGateArgs const& a, int images_per_cta, cudaStream_t stream) {
  switch (images_per_cta) {
    case 1: return launch_images<1>(a, stream);
    case 2: return launch_images<2>(a, stream);
    case 4: return launch_images<4>(a, stream);
    case 8: return launch_images<8>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace se_gate
}  // namespace cutlass_ops
