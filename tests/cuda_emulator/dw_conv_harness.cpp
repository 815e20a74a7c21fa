// cutlass_ops::dw_conv's kernel (kernels/dw_conv3x3_tokens/dw_conv3x3_tokens_device.cuh) on the CPU emulator, with
// the vector width the CUDA launcher would pick.  Built by tests/python/test_dw_conv.py:
//   g++ -I kernels -include cuda_emulate_prelude.h dw_conv_harness.cpp
#include "dw_conv3x3_tokens/dw_conv3x3_tokens_device.cuh"

using namespace cutlass_ops::dw_conv;

// Returns 0, 1 on a deadlock (2: layer_norm asked where the tiled kernel does not run); vec_out:
// the vector width used; tiled_out: 1 where the tiled kernel ran; layer_norm: x and lead
// LayerNormed first (ln_*: DwConvArgs's) (dw_conv_plan, as the launcher for a GPU of 2 SMs, `tiled` as CUTLASS_OPS_DW_TILE).
// strides and y: `projections` entries each.  grid 0: the strip kernel's launcher count for a
// GPU of 2 SMs (so that threads loop over several rows).
extern "C" int emu_dw_conv(int bf16, long long n, int h, int w, int c, int projections, const int* strides, int lead,
                           const void* x, long long x_image_stride, const void* weight, const void* bias,
                           int params_f32, const void* lead_tokens, long long lead_image_stride, void* const* y,
                           unsigned grid, unsigned seed, int tiled, int* vec_out, int* tiled_out,
                           int layer_norm, const void* ln_weight, const void* ln_bias, int ln_params_f32,
                           float ln_eps) {
  DwConvArgs a{};
  a.dtype = bf16 ? DType::kBF16 : DType::kF16;
  a.n = n;
  a.h = h;
  a.w = w;
  a.c = c;
  a.projections = projections;
  for (int j = 0; j < projections; ++j) {
    a.stride[j] = strides[j];
    a.ho[j] = (h - 1) / strides[j] + 1;
    a.wo[j] = (w - 1) / strides[j] + 1;
    a.y[j] = y[j];
  }
  a.lead = lead;
  a.x = x;
  a.x_image_stride = x_image_stride;
  a.weight = weight;
  a.bias = bias;
  a.params_f32 = params_f32 != 0;
  a.lead_tokens = lead_tokens;
  a.lead_image_stride = lead_image_stride;
  a.layer_norm = layer_norm != 0;  // (the launcher requires the tiled kernel for it: the caller checks tiled_out)
  a.ln_weight = ln_weight;
  a.ln_bias = ln_bias;
  a.ln_params_f32 = ln_params_f32 != 0;
  a.ln_eps = ln_eps;
  const DwConvPlan plan = dw_conv_plan(a, 2, tiled != 0);
  const int vec = plan.vec;
  *vec_out = vec;
  *tiled_out = plan.tiled ? 1 : 0;
  if (a.layer_norm && !plan.tiled) return 2;
  if (plan.tiled) {
    std::vector<uint4> tile((plan.smem_bytes + 15) / 16);
    const TileShape shape = plan.shape;
    auto body = [&] {
      if (bf16) dw_tile_body<__nv_bfloat16>(a, shape, tile.data());
      else dw_tile_body<__half>(a, shape, tile.data());
    };
    return cuda_emu::launch(body, static_cast<unsigned>(plan.grid), kTileThreads,
                            reinterpret_cast<unsigned char*>(tile.data()), tile.size() * 16, seed) ? 0 : 1;
  }
  static unsigned char no_smem[16];
  if (grid == 0) grid = static_cast<unsigned>(dw_conv_ctas(a, vec, 2 * 32));
  auto body = [&] {  // the variant the CUDA launcher runs (with_kernel_variant)
    with_kernel_variant(vec, a.params_f32, [&](auto v, auto packed) {
      if (bf16) dw_conv_kernel<__nv_bfloat16, decltype(v)::value, decltype(packed)::value>(a);
      else dw_conv_kernel<__half, decltype(v)::value, decltype(packed)::value>(a);
    });
  };
  return cuda_emu::launch(body, grid, kThreads, no_smem, sizeof(no_smem), seed) ? 0 : 1;
}

// The input-gradient kernel (dw_conv_backward_input_kernel) with the launcher's vector width:
// grad_y[j] (n, ho*wo, c) with image strides grad_image_stride[j]; grad_x (n, h*w, c).
// Returns 0, 1 on a deadlock; vec_out: the vector width used.
extern "C" int emu_dw_conv_backward_input(int bf16, long long n, int h, int w, int c, int projections,
                                          const int* strides, const void* const* grad_y,
                                          const long long* grad_image_stride, const void* weight, int params_f32,
                                          void* grad_x, unsigned grid, unsigned seed, int* vec_out) {
  DwConvBackwardArgs a{};
  a.dtype = bf16 ? DType::kBF16 : DType::kF16;
  a.n = n;
  a.h = h;
  a.w = w;
  a.c = c;
  a.projections = projections;
  for (int j = 0; j < projections; ++j) {
    a.stride[j] = strides[j];
    a.ho[j] = (h - 1) / strides[j] + 1;
    a.wo[j] = (w - 1) / strides[j] + 1;
    a.grad_y[j] = grad_y[j];
    a.grad_image_stride[j] = grad_image_stride[j];
  }
  a.weight = weight;
  a.params_f32 = params_f32 != 0;
  a.grad_x = grad_x;
  const int vec = dw_conv_backward_vec(a);
  *vec_out = vec;
  static unsigned char no_smem[16];
  if (grid == 0) grid = static_cast<unsigned>(dw_conv_backward_ctas(a, vec, 2 * 32));
  auto body = [&] {  // the variant the CUDA launcher runs (with_kernel_variant)
    with_kernel_variant(vec, a.params_f32, [&](auto v, auto packed) {
      if (bf16) dw_conv_backward_input_kernel<__nv_bfloat16, decltype(v)::value, decltype(packed)::value>(a);
      else dw_conv_backward_input_kernel<__half, decltype(v)::value, decltype(packed)::value>(a);
    });
  };
  return cuda_emu::launch(body, grid, kThreads, no_smem, sizeof(no_smem), seed) ? 0 : 1;
}
