// One back-to-back conv instance: a KxRxS conv with bias + ReLU, then a 1x1 conv with bias
// + ReLU, fused by CUTLASS's B2bImplicitGemmConvolution (Sm80; the first conv's output tile
// never leaves the CTA: converted in registers, or staged in shared memory for K1 >= 128,
// into the second conv's A operand).  The
// generator writes one .cu per (dtype, K0, K1) that expands CUTLASS_OPS_B2B_INSTANCE.
//
// CUTLASS's constraints (kernel/default_b2b_conv2d_fprop_sm80.h, the example's README):
// each conv's output channels equal its thread block tile's N (K0 = TB0::kN, K1 = TB1::kN),
// warp N0 == TB0 N0, the second conv is 1x1 without padding or stride.  There is no Sm70 B2B
// conv in CUTLASS (Sm75 and Sm80 only), so Volta builds have no instances.
#pragma once

#include "cutlass/conv/conv2d_problem_size.h"
#include "cutlass/conv/kernel/default_conv2d_fprop.h"
#include "cutlass/epilogue/thread/linear_combination_relu.h"
// From the wheel's source/examples/13_two_tensor_op_fusion (not in include/).
#include "device/b2b_implicit_gemm_convolution.h"
#include "kernel/default_b2b_conv2d_fprop_sm80.h"
#include "kernel/default_b2b_conv2d_fprop_smem_accumulator_sm80.h"

#include "conv2d_b2b/conv2d_b2b_args.h"

namespace cutlass_ops {
namespace conv2d_b2b {

// K1 <= 64: "RF-resident", four warps per CTA in both GEMMs (B2B needs the same warp count),
// 32 rows of the GEMM's M each and the whole N (K0, then K1) per warp: 128 rows per CTA, 12%
// faster than 64 rows (two warps) on an H100 at 64 -> 64, N=128, 56x56
// (docs/experiments/b2b_tiles/; 32 -> 64 takes the same shape, not timed on its own).
// K1 >= 128: the first conv's output goes through shared memory instead ("smem-resident",
// kernel/default_b2b_conv2d_fprop_smem_accumulator_sm80.h) and four warps split both GEMMs (the
// shapes of the example's fused_two_convs_f16_sm80_shmem.cu, warp N = K1 / 4).  Why not RF at
// K1 = 128: with half_t output and float accumulators, CUTLASS's RF-resident kernel at a warp
// N of 128 returns wrong numbers (relative error 0.7 on an H100, also as compute_80 PTX and
// with four warps; bf16, half accumulators and the smem-resident kernel are right:
// docs/experiments/b2b_f16_k128/).  At K1 = 256 a whole-N warp would hold 256 float
// accumulators per thread anyway.
template <int K0, int K1, bool kSmem = (K1 > 64)>
struct B2bTiles {
  using ThreadblockShape0 = cutlass::gemm::GemmShape<128, K0, 32>;
  using WarpShape0 = cutlass::gemm::GemmShape<32, K0, 32>;
  using ThreadblockShape1 = cutlass::gemm::GemmShape<128, K1, 32>;
  using WarpShape1 = cutlass::gemm::GemmShape<32, K1, 32>;
  static constexpr bool kSmemAccumulator = false;
};

template <int K0, int K1>
struct B2bTiles<K0, K1, true> {
  static_assert(K0 == 64 && (K1 == 128 || K1 == 256), "the smem-resident B2B tiles are written for 64 -> 128 and 64 -> 256");
  using ThreadblockShape0 = cutlass::gemm::GemmShape<64, K0, 32>;
  using WarpShape0 = cutlass::gemm::GemmShape<32, 32, 32>;
  using ThreadblockShape1 = cutlass::gemm::GemmShape<64, K1, 32>;
  using WarpShape1 = cutlass::gemm::GemmShape<64, K1 / 4, 32>;
  static constexpr bool kSmemAccumulator = true;
};

// Tiles and Accumulator are parameters so that experiments (docs/experiments/b2b_f16_k128/)
// can instantiate other shapes through the same code; the generated instances use the defaults.
template <typename Element, int K0, int K1, typename Tiles_ = B2bTiles<K0, K1>, typename Accumulator = float>
struct B2bConfig {
  using ElementAccumulator = Accumulator;
  using ElementCompute = float;
  using Tiles = Tiles_;
  using ThreadblockShape0 = typename Tiles::ThreadblockShape0;
  using WarpShape0 = typename Tiles::WarpShape0;
  using ThreadblockShape1 = typename Tiles::ThreadblockShape1;
  using WarpShape1 = typename Tiles::WarpShape1;
  using InstructionShape = cutlass::gemm::GemmShape<16, 8, 16>;
  // The first epilogue works on one mma's accumulators at a time; its bias is a float
  // vector (ref_Bias0), alpha 1.
  using EpilogueOutputOp0 = cutlass::epilogue::thread::LinearCombinationRelu<
      Element, InstructionShape::kM * InstructionShape::kN / 32, ElementAccumulator, ElementCompute,
      cutlass::epilogue::thread::ScaleType::OnlyAlphaScaling>;
  // The second: relu(acc + C1), C1 = bias1 broadcast (stride 0).
  using EpilogueOutputOp1 = cutlass::epilogue::thread::LinearCombinationRelu<
      Element, 128 / cutlass::sizeof_bits<Element>::value, ElementAccumulator, ElementCompute,
      cutlass::epilogue::thread::ScaleType::NoBetaScaling>;
  using Kernel = typename cutlass::conv::kernel::DefaultB2bConv2dFprop<
      Element, cutlass::layout::TensorNHWC, Element, cutlass::layout::TensorNHWC, Element,
      cutlass::layout::TensorNHWC, ElementAccumulator, cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
      ThreadblockShape0, ThreadblockShape1, WarpShape0, WarpShape1, InstructionShape, EpilogueOutputOp0,
      EpilogueOutputOp1, cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<1>, 3,
      cutlass::arch::OpMultiplyAdd, cutlass::conv::IteratorAlgorithm::kOptimized, Tiles::kSmemAccumulator>::Kernel;
  using Operation = cutlass::conv::device::B2bImplicitGemmConvolution<Kernel>;
};

// launches > 1: the same kernel that many times after one set-up (experiments time it so).
template <typename Element, int K0, int K1, typename Tiles = B2bTiles<K0, K1>, typename Accumulator = float>
cutlass::Status run_b2b(Conv2dB2bArgs const& a, cudaStream_t stream, int launches = 1) {
  using Config = B2bConfig<Element, K0, K1, Tiles, Accumulator>;
  using Op = typename Config::Operation;
  using LayoutNHWC = cutlass::layout::TensorNHWC;
  using ScaleBias = typename Op::ElementScaleBias;
  static_assert(sizeof(ScaleBias) == sizeof(float), "bias0 is passed as float32");
  if (a.K0 != K0 || a.K1 != K1) return cutlass::Status::kErrorInvalidProblem;
  cutlass::conv::Conv2dProblemSize p0({a.N, a.H, a.W, a.C}, {a.K0, a.R, a.S, a.C},
                                      {a.pad_h, a.pad_h, a.pad_w, a.pad_w}, {a.stride_h, a.stride_w}, {1, 1},
                                      {a.N, a.P, a.Q, a.K0}, cutlass::conv::Mode::kCrossCorrelation, 1);
  cutlass::conv::Conv2dProblemSize p1({a.N, a.P, a.Q, a.K0}, {a.K1, 1, 1, a.K0}, {0, 0, 0, 0}, {1, 1}, {1, 1},
                                      {a.N, a.P, a.Q, a.K1}, cutlass::conv::Mode::kCrossCorrelation, 1);
  auto* x = static_cast<Element*>(const_cast<void*>(a.input));
  auto* w0 = static_cast<Element*>(const_cast<void*>(a.w0));
  auto* w1 = static_cast<Element*>(const_cast<void*>(a.w1));
  auto* b1 = static_cast<Element*>(const_cast<void*>(a.bias1));
  auto* b0 = reinterpret_cast<ScaleBias*>(const_cast<float*>(a.bias0));
  typename Op::Arguments args(
      p0, p1, {x, LayoutNHWC::packed({a.N, a.H, a.W, a.C})}, {w0, LayoutNHWC::packed({a.K0, a.R, a.S, a.C})},
      {nullptr, LayoutNHWC::packed({a.N, a.P, a.Q, a.K0})},  // C0: unused (the bias is ref_Bias0)
      {nullptr, typename Op::LayoutScaleBias(a.K0)},         // no per-channel scale
      {b0, typename Op::LayoutScaleBias(a.K0)}, {w1, LayoutNHWC::packed({a.K1, 1, 1, a.K0})},
      {b1, LayoutNHWC::Stride(0)},  // bias1 broadcast over N, P, Q
      {static_cast<Element*>(a.output), LayoutNHWC::packed({a.N, a.P, a.Q, a.K1})},
      {1.0f, 0.0f}, {1.0f, 1.0f}, cutlass::conv::SplitKMode::kSerial);
  Op op;
  cutlass::Status status = op.can_implement(args);
  if (status != cutlass::Status::kSuccess) return status;
  status = op.initialize(args, nullptr, stream);
  for (int i = 0; i < launches && status == cutlass::Status::kSuccess; ++i) status = op(stream);
  return status;
}

}  // namespace conv2d_b2b
}  // namespace cutlass_ops

// The generated .cu: CUTLASS_OPS_B2B_INSTANCE(name, cutlass::half_t, 64, 128)
#define CUTLASS_OPS_B2B_INSTANCE(NAME, ELEMENT, K0, K1)                                              \
  namespace cutlass_ops {                                                                            \
  namespace conv2d_b2b {                                                                             \
  cutlass::Status NAME(Conv2dB2bArgs const& a, cudaStream_t stream) {                               \
    return run_b2b<ELEMENT, K0, K1>(a, stream);                                                      \
  }                                                                                                  \
  }                                                                                                  \
  }
