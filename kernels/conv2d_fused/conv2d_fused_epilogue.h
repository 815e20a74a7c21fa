// Epilogue functor of the fused conv: z = act(scale * acc + bias[k] + bias_s + residual) + post_bias,
// act the identity, ReLU or SiLU per call (Params::act: conv2d_fused_args.h's Activation).
//
// Serial split-K: every K-partition but the last stores its raw partial sum (it reads the
// previous partition's from D as its source); the last one applies the epilogue to the
// full sum.  The source slot then carries partial sums, so split-K excludes a residual
// (the dispatcher never combines them).
//
// It plugs into CUTLASS's EpilogueWithBroadcast (DefaultConv2dFpropWithBroadcast): the
// broadcast vector is the per-channel bias, the source tensor C is the residual.  The
// scalars are read from device memory when the functor is built (once per thread), so
// they can be trainable parameters and the launch needs no host sync.
#pragma once

#include "cutlass/array.h"
#include "cutlass/cutlass.h"
#include "cutlass/numeric_conversion.h"
#include "cutlass/numeric_types.h"

namespace cutlass_ops {
namespace epilogue {

// Template parameters follow cutlass::epilogue::thread::LinearCombination's, so the CUTLASS
// emitter can name it through its EpilogueFunctorTag table.
template <typename ElementOutput_, int Count, typename ElementAccumulator_ = float,
          typename ElementCompute_ = float>
class FusedConvEpilogue {
 public:
  using ElementOutput = ElementOutput_;
  using ElementC = ElementOutput_;
  using ElementAccumulator = ElementAccumulator_;
  using ElementCompute = ElementCompute_;
  using ElementZ = ElementOutput_;
  using ElementT = ElementOutput_;      // no second output (kStoreT = false)
  using ElementVector = ElementCompute_; // the bias vector is float32

  static int const kElementsPerAccess = Count;
  static int const kCount = Count;
  static bool const kIsSingleSource = true;  // one source tensor: the residual
  static bool const kIsHeavy = false;
  static bool const kStoreZ = true;
  static bool const kStoreT = false;

  using FragmentAccumulator = cutlass::Array<ElementAccumulator, kCount>;
  using FragmentCompute = cutlass::Array<ElementCompute, kCount>;
  using FragmentC = cutlass::Array<ElementC, kCount>;
  using FragmentOutput = cutlass::Array<ElementOutput, kCount>;
  using FragmentZ = cutlass::Array<ElementZ, kCount>;
  using FragmentT = cutlass::Array<ElementT, kCount>;

  struct Params {
    ElementCompute const* scale_ptr{nullptr};
    ElementCompute const* bias_scalar_ptr{nullptr};
    ElementCompute const* post_bias_ptr{nullptr};
    int act{0};  // 0 identity, 1 ReLU, 2 SiLU
    bool has_residual{false};

    CUTLASS_HOST_DEVICE Params() {}
    CUTLASS_HOST_DEVICE Params(ElementCompute const* scale, ElementCompute const* bias_scalar,
                               ElementCompute const* post_bias, int act_, bool has_residual_)
        : scale_ptr(scale), bias_scalar_ptr(bias_scalar), post_bias_ptr(post_bias),
          act(act_), has_residual(has_residual_) {}
  };

 private:
  ElementCompute scale_;
  ElementCompute bias_scalar_;
  ElementCompute post_bias_;
  int act_;
  bool has_residual_;
  int k_partition_ = 0;
  int k_partitions_ = 1;

 public:
  CUTLASS_HOST_DEVICE
  explicit FusedConvEpilogue(Params const& p)
      : scale_(p.scale_ptr ? *p.scale_ptr : ElementCompute(1)),
        bias_scalar_(p.bias_scalar_ptr ? *p.bias_scalar_ptr : ElementCompute(0)),
        post_bias_(p.post_bias_ptr ? *p.post_bias_ptr : ElementCompute(0)),
        act_(p.act),
        has_residual_(p.has_residual) {}

  CUTLASS_HOST_DEVICE bool is_source_needed() const { return has_residual_ || k_partition_ > 0; }

  CUTLASS_HOST_DEVICE void set_k_partition(int k_partition, int k_partitions) {
    k_partition_ = k_partition;
    k_partitions_ = k_partitions;
  }

  // With a source: the residual, or (split-K, partition > 0) the partial sum so far.
  CUTLASS_HOST_DEVICE
  void operator()(FragmentZ& frag_Z, FragmentT&, FragmentAccumulator const& AB,
                  FragmentC const& source, FragmentCompute const& bias) const {
    cutlass::NumericArrayConverter<ElementCompute, ElementC, kCount> to_compute;
    cutlass::NumericArrayConverter<ElementCompute, ElementAccumulator, kCount> acc_to_compute;
    FragmentCompute src = to_compute(source);
    FragmentCompute acc = acc_to_compute(AB);
    if (k_partition_ > 0) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kCount; ++i) acc[i] += src[i];
      finish(frag_Z, acc, bias, nullptr);
    } else {
      finish(frag_Z, acc, bias, &src);
    }
  }

  // Without a source.
  CUTLASS_HOST_DEVICE
  void operator()(FragmentZ& frag_Z, FragmentT&, FragmentAccumulator const& AB,
                  FragmentCompute const& bias) const {
    cutlass::NumericArrayConverter<ElementCompute, ElementAccumulator, kCount> acc_to_compute;
    finish(frag_Z, acc_to_compute(AB), bias, nullptr);
  }

 private:
  CUTLASS_HOST_DEVICE
  void finish(FragmentZ& frag_Z, FragmentCompute const& acc, FragmentCompute const& bias,
              FragmentCompute const* residual) const {
    cutlass::NumericArrayConverter<ElementZ, ElementCompute, kCount> to_output;
    if (k_partition_ + 1 < k_partitions_) {  // not the last K-partition: store the partial sum
      frag_Z = to_output(acc);
      return;
    }
    FragmentCompute z;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kCount; ++i) {
      ElementCompute v = scale_ * acc[i] + bias[i] + bias_scalar_;
      if (residual) v += (*residual)[i];
      // "v < 0 ? 0 : v" keeps NaN as NaN, like torch.relu; SiLU as torch's, v / (1 + exp(-v)).
      if (act_ == 1) v = v < ElementCompute(0) ? ElementCompute(0) : v;
      if (act_ == 2) v = v / (ElementCompute(1) + expf(-v));
      z[i] = v + post_bias_;
    }
    frag_Z = to_output(z);
  }
};

}  // namespace epilogue
}  // namespace cutlass_ops
