// The fused conv epilogue for the Hopper (family 90, CUTLASS 3.x) kernels, as an epilogue
// visitor tree (EVT).  Same math as the family-80 functor (conv2d_fused_epilogue.h):
//
//   y = act(scale * acc + bias[k] + bias_scalar + residual) + post_bias
//
// evaluated in float32 in that order (scale * acc + bias[k] is one fma, as nvcc contracts the
// family-80 expression), act = ReLU ("v < 0 ? 0 : v": NaN stays NaN, like torch.relu) or the
// identity per call (no SiLU: see ActivationIf), the result rounded once to the output type.
// Null pointers mean
// "absent": scale 1, bias 0, bias_scalar 0, post_bias 0, no residual.
//
// The tree, leaves first (GEMM M = N*P*Q output pixels, GEMM N = K output channels):
//
//   scale   : Sm90ScalarBroadcast  (device pointer, or the value 1 when the pointer is null)
//   acc     : Sm90AccFetch
//   bias[k] : Sm90RowBroadcast     (a row vector: one value per GEMM column n = output channel k;
//                                   a null pointer reads as its null_default 0)
//   mad     : Sm90Compute<homogeneous_multiply_add>(scale, acc, bias)  = scale * acc + bias[k]
//   + bias_scalar : Sm90ScalarBroadcast (pointer, or 0)
//   + residual    : OptionalSrcFetch, the source tensor C, loaded by TMA only when the call has
//                   a residual; otherwise never read (and zeros in its place)
//   act     : Sm90Compute<ActivationIf>, whose run-time argument says identity or ReLU
//   + post_bias   : Sm90ScalarBroadcast (pointer, or 0); this node rounds to the output type.
//
// The scalars are read from device memory when the kernel's epilogue is constructed, i.e.
// at kernel start: run_sm90_instance (conv2d_fused_sm90_instance.cuh) wraps the CUTLASS
// kernel so that it waits for the previous grid first (programmatic dependent launch).
// No split-K here: the 3.x conv kernel has no serial split-K (the dispatcher never asks).
#pragma once

#include "cutlass/array.h"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_compute_tma_warpspecialized.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_load_tma_warpspecialized.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp"
#include "cutlass/functional.h"
#include "cutlass/numeric_conversion.h"

#include "cute/tensor.hpp"

namespace cutlass_ops {
namespace epilogue {
namespace sm90 {

// The activation, chosen per call (Sm90Compute passes an Arguments member to the functor as
// its last operand): 0 identity, 1 ReLU ("v < 0 ? 0 : v", so that NaN stays NaN).  No SiLU
// here: its branch (expf and a division) took these kernels from 95 to 125-133 registers a
// thread, and with them from two CTAs per SM to one: every family-90 conv of FusedResNet ran
// 1.4-1.7x longer on an H100.  SiLU calls run the family-80 kernels (the
// dispatcher skips family 90 for them); sm90 GEMMs with SiLU are kernels/linear_silu's.
struct ActivationArguments {
  int act = 0;
};

template <typename T>
struct ActivationIf {
  using Arguments = ActivationArguments;
  CUTLASS_HOST_DEVICE T operator()(T const& v, Arguments const& args) const {
    return (args.act == 1 && v < T(0)) ? T(0) : v;
  }
};

template <typename T, int N>
struct ActivationIf<cutlass::Array<T, N>> {
  using Arguments = ActivationArguments;
  CUTLASS_HOST_DEVICE cutlass::Array<T, N> operator()(cutlass::Array<T, N> const& v,
                                                      Arguments const& args) const {
    cutlass::Array<T, N> out;
    ActivationIf<T> one;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) out[i] = one(v[i], args);
    return out;
  }
};

// The source tensor C (the residual), fetched only when Arguments::enabled.  Like CUTLASS's
// Sm90SrcFetch, except that whether C is loaded is decided per call: with enabled == false
// is_C_load_needed() is false, so the collective epilogue issues no TMA load of C (its
// pointer may be anything valid; it is never dereferenced) and this node yields zeros.
template <class Element>
struct OptionalSrcFetch {
  struct SharedStorage {};

  struct Arguments {
    bool enabled = false;
  };

  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    return args;
  }

  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const&) {
    return true;
  }

  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) {
    return 0;
  }

  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*, cudaStream_t,
                                              cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }

  CUTLASS_HOST_DEVICE OptionalSrcFetch() {}

  CUTLASS_HOST_DEVICE OptionalSrcFetch(Params const& params, SharedStorage const&) : params(params) {}

  Params params;

  CUTLASS_DEVICE bool is_producer_load_needed() const { return is_C_load_needed(); }

  CUTLASS_DEVICE bool is_C_load_needed() const { return params.enabled; }

  template <class... Args>
  CUTLASS_DEVICE auto get_producer_load_callbacks(
      cutlass::epilogue::fusion::detail::ProducerLoadArgs<Args...> const&) {
    return cutlass::epilogue::fusion::detail::EmptyProducerLoadCallbacks{};
  }

  template <class SrcTensor>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::detail::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE ConsumerStoreCallbacks(SrcTensor const& tCrC, bool enabled) : tCrC(tCrC), enabled(enabled) {}

    SrcTensor const& tCrC;  // (CPY,CPY_M,CPY_N): C of this subtile, valid only when enabled
    bool enabled;

    template <typename ElementAccumulator, int FragmentSize>
    CUTLASS_DEVICE cutlass::Array<typename SrcTensor::value_type, FragmentSize> visit(
        cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v, int, int) {
      using Fragment = cutlass::Array<typename SrcTensor::value_type, FragmentSize>;
      Fragment frg;
      if (enabled) {
        frg = cute::recast<Fragment>(tCrC)(epi_v);
      } else {
        frg.clear();  // C was not loaded: its registers hold garbage
      }
      return frg;
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(
      cutlass::epilogue::fusion::detail::ConsumerStoreArgs<Args...> const& args) {
    using SrcTensor = cute::remove_cvref_t<decltype(args.tCrC)>;
    return ConsumerStoreCallbacks<SrcTensor>(args.tCrC, params.enabled);
  }
};

// The tree (see the top of this file).  ElementOutput: the 16-bit output (and residual) type;
// CtaTileShapeMNK: the kernel's tile shape (the bias row broadcast stages one tile's row in
// shared memory).
template <class ElementOutput, class CtaTileShapeMNK, class ElementCompute = float,
          cutlass::FloatRoundStyle RoundStyle = cutlass::FloatRoundStyle::round_to_nearest>
struct FusedConvEvt {
  template <template <class> class Fn, class Out = ElementCompute>
  using Compute = cutlass::epilogue::fusion::Sm90Compute<Fn, Out, ElementCompute, RoundStyle>;
  using Scalar = cutlass::epilogue::fusion::Sm90ScalarBroadcast<ElementCompute>;
  using ChannelBias = cutlass::epilogue::fusion::Sm90RowBroadcast<
      0, CtaTileShapeMNK, ElementCompute, ElementCompute, cute::Stride<cute::_0, cute::_1, cute::_0>>;
  using Acc = cutlass::epilogue::fusion::Sm90AccFetch;

  template <class Node, class... Children>
  using EVT = cutlass::epilogue::fusion::Sm90EVT<Node, Children...>;

  using ScaleAccBias = EVT<Compute<cutlass::homogeneous_multiply_add>, Scalar, Acc, ChannelBias>;
  using PlusBiasScalar = EVT<Compute<cutlass::plus>, ScaleAccBias, Scalar>;
  using PlusResidual = EVT<Compute<cutlass::plus>, PlusBiasScalar, OptionalSrcFetch<ElementOutput>>;
  using Act = EVT<Compute<ActivationIf>, PlusResidual>;
  using Callbacks = EVT<Compute<cutlass::plus, ElementOutput>, Act, Scalar>;

  using Arguments = typename Callbacks::Arguments;

  // The tree's arguments for one call.  Each EVT node's Arguments lists its children's
  // (op_0, op_1, ...) and then its own.
  static Arguments arguments(ElementCompute const* scale, ElementCompute const* bias,
                             ElementCompute const* bias_scalar, bool has_residual, int act_kind,
                             ElementCompute const* post_bias) {
    Arguments root{};
    root.op_1.scalars[0] = ElementCompute(0);  // + post_bias
    root.op_1.scalar_ptrs[0] = post_bias;
    auto& act = root.op_0;
    act.op_1.act = act_kind;
    auto& plus_residual = act.op_0;
    plus_residual.op_1.enabled = has_residual;
    auto& plus_bias_scalar = plus_residual.op_0;
    plus_bias_scalar.op_1.scalars[0] = ElementCompute(0);
    plus_bias_scalar.op_1.scalar_ptrs[0] = bias_scalar;
    auto& mad = plus_bias_scalar.op_0;
    mad.op_0.scalars[0] = ElementCompute(1);  // scale
    mad.op_0.scalar_ptrs[0] = scale;
    mad.op_2.ptr_row = bias;                   // per-channel bias; null reads as null_default
    mad.op_2.null_default = ElementCompute(0);
    return root;
  }
};

}  // namespace sm90
}  // namespace epilogue
}  // namespace cutlass_ops
