// Tile shapes the experiment tries for conv2d_b2b f16 64 -> 128 (see README.md).
#pragma once
#include "conv2d_b2b/conv2d_b2b_instance.cuh"

namespace exp_b2b {
using cutlass::gemm::GemmShape;
// The shipped RF-resident tiles with 4 warps instead of 2 (128 GEMM rows per CTA).
struct Rf4Warps {
  using ThreadblockShape0 = GemmShape<128, 64, 32>;
  using WarpShape0 = GemmShape<32, 64, 32>;
  using ThreadblockShape1 = GemmShape<128, 128, 32>;
  using WarpShape1 = GemmShape<32, 128, 32>;
  static constexpr bool kSmemAccumulator = false;
};
// Shared-memory-resident, 4 warps in both GEMMs (the 64 -> 256 instance's scheme at N = 128).
struct Smem128 {
  using ThreadblockShape0 = GemmShape<64, 64, 32>;
  using WarpShape0 = GemmShape<32, 32, 32>;
  using ThreadblockShape1 = GemmShape<64, 128, 32>;
  using WarpShape1 = GemmShape<64, 32, 32>;
  static constexpr bool kSmemAccumulator = true;
};
}  // namespace exp_b2b
