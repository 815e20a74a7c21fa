// cutlass_ops::layer_norm's kernel (kernels/layer_norm_rows/layer_norm_rows_device.cuh) on the CPU
// emulator, with the shape the CUDA launcher would pick.  Built by tests/python/test_layer_norm.py:
//   g++ -I kernels -include cuda_emulate_prelude.h layer_norm_harness.cpp
#include "layer_norm_rows/layer_norm_rows_device.cuh"

using namespace cutlass_ops::layer_norm;

namespace {
template <typename T>
struct Emulate {
  LayerNormArgs const& a;
  unsigned grid, seed;
  template <int kVec, int kLanes, int kChunks>
  int run() const {
    auto body = [&] {
      if (a.residual)
        layer_norm_kernel<T, kVec, kLanes, kChunks, true>(a);
      else
        layer_norm_kernel<T, kVec, kLanes, kChunks, false>(a);
    };
    static unsigned char no_smem[16];
    return cuda_emu::launch(body, grid, kThreads, no_smem, sizeof(no_smem), seed) ? 0 : 1;
  }
};
}  // namespace

// Returns 0, 1 on a deadlock, 2 where the kernel does not cover the shape.  grid 0: the
// launcher's own count for a GPU of 2 SMs (so that CTAs loop over several row groups).
extern "C" int emu_layer_norm(int bf16, long long rows, int cols, float eps, const void* x, const void* residual,
                              const void* weight, const void* bias, int params_f32, void* y, void* sum, float* mean,
                              float* rstd, unsigned grid, unsigned seed, int* shape_out) {
  LayerNormArgs a{};
  a.dtype = bf16 ? DType::kBF16 : DType::kF16;
  a.rows = rows;
  a.cols = cols;
  a.eps = eps;
  a.x = x;
  a.residual = residual;
  a.weight = weight;
  a.bias = bias;
  a.params_f32 = params_f32 != 0;
  a.y = y;
  a.sum = sum;
  a.mean = mean;
  a.rstd = rstd;
  const LayerNormShape sh = layer_norm_shape(a);
  shape_out[0] = sh.vec;
  shape_out[1] = sh.lanes;
  shape_out[2] = sh.chunks;
  if (sh.lanes == 0) return 2;
  if (grid == 0) grid = static_cast<unsigned>(layer_norm_ctas(rows, sh.lanes, 2 * 16));
  return bf16 ? with_layer_norm_shape(sh, Emulate<__nv_bfloat16>{a, grid, seed})
              : with_layer_norm_shape(sh, Emulate<__half>{a, grid, seed});
}

namespace {
template <typename T>
struct EmulateBackward {
  LayerNormBackwardArgs const& a;
  unsigned grid, seed;
  template <bool kGradSum, bool kParamGrads, int kVec, int kLanes, int kChunks>
  int go() const {
    auto body = [&] { layer_norm_backward_kernel<T, kVec, kLanes, kChunks, kGradSum, kParamGrads>(a); };
    static unsigned char no_smem[16];
    return cuda_emu::launch(body, grid, kThreads, no_smem, sizeof(no_smem), seed) ? 0 : 1;
  }
  template <int kVec, int kLanes, int kChunks>
  int run() const {
    if constexpr (kVec * kChunks > 32) {
      return 2;
    } else {
      if (a.grad_sum && a.partials) return go<true, true, kVec, kLanes, kChunks>();
      if (a.grad_sum) return go<true, false, kVec, kLanes, kChunks>();
      if (a.partials) return go<false, true, kVec, kLanes, kChunks>();
      return go<false, false, kVec, kLanes, kChunks>();
    }
  }
};
}  // namespace

// The backward on `grid` CTAs (the caller's partials hold `grid` rows per parameter when
// given).  Returns 0, 1 on a deadlock, 2 where the kernel does not cover the shape.
extern "C" int emu_layer_norm_backward(int bf16, long long rows, int cols, const void* grad_y, const void* grad_sum,
                                       const void* s, const float* mean, const float* rstd, const void* weight,
                                       int params_f32, void* grad_x, float* partials, unsigned grid, unsigned seed,
                                       int* shape_out) {
  LayerNormBackwardArgs a{};
  a.dtype = bf16 ? DType::kBF16 : DType::kF16;
  a.rows = rows;
  a.cols = cols;
  a.grad_y = grad_y;
  a.grad_sum = grad_sum;
  a.s = s;
  a.mean = mean;
  a.rstd = rstd;
  a.weight = weight;
  a.params_f32 = params_f32 != 0;
  a.grad_x = grad_x;
  a.partials = partials;
  a.partial_rows = grid;
  const LayerNormShape sh = layer_norm_backward_shape(a);
  shape_out[0] = sh.vec;
  shape_out[1] = sh.lanes;
  shape_out[2] = sh.chunks;
  if (sh.lanes == 0) return 2;
  return bf16 ? with_layer_norm_shape(sh, EmulateBackward<__nv_bfloat16>{a, grid, seed})
              : with_layer_norm_shape(sh, EmulateBackward<__half>{a, grid, seed});
}
