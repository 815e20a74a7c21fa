// cutlass_ops::layer_norm's kernel (kernels/layer_norm/layer_norm_device.cuh) on the CPU
// emulator, with the shape the CUDA launcher would pick.  Built by tests/python/test_layer_norm.py:
//   g++ -I kernels -include cuda_emulate_prelude.h layer_norm_harness.cpp
#include "layer_norm/layer_norm_device.cuh"

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
