// conv2d_fused for 3x3 / stride 1 / pad 1, C = K = 64, W = 16 on sm_90a: the input tile is read
// once with its halo, not nine times through im2col (the design: conv2d_fused_sm90_halo.cuh).
//
// Each consumer group owns every other tile of the CTA, so one group's epilogue runs under the
// other's MMAs.  The epilogue transposes back through shared memory and writes whole pixel rows
// with 16-byte stores.
#include "conv2d_fused/conv2d_fused_sm90_halo.h"

#include "conv2d_fused/conv2d_fused_sm90_halo.cuh"

namespace cutlass_ops {
namespace conv2d_fused {
namespace sm90_halo {

struct Epilogue {
  void* output;
  float const* bias;         // [K] or null
  float const* bias_scalar;  // or null
  float const* scale;        // or null
  float const* post_bias;    // or null
  int relu;
  int tiles;                 // N * H / kTileRows
  int tiles_per_image;       // H / kTileRows
};

template <typename T>
__global__ void __launch_bounds__(kThreads, 1)
    halo_conv_kernel(__grid_constant__ CUtensorMap const tmap_x, __grid_constant__ CUtensorMap const tmap_w,
                     Epilogue const ep) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ char smem_raw[];
  Smem<T>& s = smem_of<T>(smem_raw);
  int const wg = threadIdx.x / 128;
  int const local_tiles = (ep.tiles - int(blockIdx.x) + int(gridDim.x) - 1) / int(gridDim.x);
  init_barriers(s);
  wait_for_previous_grid();  // before the first read of the input or write of the output

  if (wg == 0) {  // the producer: tile t = blockIdx.x + j * gridDim.x
    if (threadIdx.x == 0)
      produce(s, tmap_x, tmap_w, local_tiles, [&](int j) {
        int const t = int(blockIdx.x) + j * int(gridDim.x);
        return make_int2(t / ep.tiles_per_image, (t % ep.tiles_per_image) * kTileRows);
      });
    return;
  }

  // The consumers.  acc is (channel, pixel) of the transposed GEMM.
  int const consumer = wg - 1, ct = threadIdx.x - 128 * wg;
  using TiledMma = decltype(make_tiled_mma(typename Mma<T>::Atom{}));
  TiledMma mma;
  auto thr = mma.get_thread_slice(ct);
  Tensor acc = partition_fragment_C(mma, Shape<Int<kK>, Int<kM>>{});

  // Per-channel epilogue operands are two values a thread (acc_channel0).
  int const ch0 = acc_channel0(ct), px0 = acc_pixel0(ct);
  float const scale = ep.scale ? *ep.scale : 1.f;
  float const bias_scalar = ep.bias_scalar ? *ep.bias_scalar : 0.f;
  float const post_bias = ep.post_bias ? *ep.post_bias : 0.f;
  float bias[2];
  for (int v1 = 0; v1 < 2; ++v1) bias[v1] = ep.bias ? ep.bias[ch0 + 8 * v1] : 0.f;
  T* out_buf = s.out[consumer];

  FullBarrier::wait(&s.filter_full, 0);
  for (int j = consumer; j < local_tiles; j += 2) {
    int const t = int(blockIdx.x) + j * int(gridDim.x);
    clear(acc);
    mma_tile(s, thr, acc, j);

    // Epilogue: y = act(scale * acc + bias[k] + bias_scalar) + post_bias in float32, one
    // rounding; transposed through shared memory (16-byte chunks XOR-swizzled by pixel % 8:
    // conflict-free both ways), then whole pixel rows with 16-byte stores.
    cutlass::arch::NamedBarrier::sync(128, 1 + consumer);  // this group's reads of the last tile are done
#pragma unroll
    for (int v1 = 0; v1 < 2; ++v1)
#pragma unroll
      for (int v0 = 0; v0 < 2; ++v0) {
        int const ch = ch0 + 8 * v1, px = px0 + v0;
        // The swizzled chunk depends on (v0, v1) only (8*v2 leaves pixel % 8 alone).
        T* dst = out_buf + out_index(px, ch);
        float const b = bias[v1] + bias_scalar;
#pragma unroll
        for (int v2 = 0; v2 < kM / 8; ++v2) {
          float v = fmaf(scale, acc(v0 + 2 * v1 + 4 * v2), b);
          if (ep.relu && v < 0.f) v = 0.f;  // NaN stays NaN, like torch.relu
          dst[8 * v2 * kK] = T(v + post_bias);
        }
      }
    cutlass::arch::NamedBarrier::sync(128, 1 + consumer);
    uint4* y = reinterpret_cast<uint4*>(static_cast<T*>(ep.output) + size_t(t) * kM * kK);
#pragma unroll
    for (int i = ct; i < kM * kK / 8; i += 128) {
      int const px = i / (kK / 8), c = i % (kK / 8);
      y[i] = *reinterpret_cast<uint4 const*>(out_buf + out_chunk(px, c));
    }
  }
#endif
}

template <typename T>
cutlass::Status run(Conv2dFusedArgs const& a, cudaStream_t stream) {
  bool const fits = a.C == kC && a.K == kK && a.R == 3 && a.S == 3 && a.stride_h == 1 && a.stride_w == 1 &&
                    a.pad_h == 1 && a.pad_w == 1 && a.W == kW && a.Q == kW && a.P == a.H && a.H % kTileRows == 0 &&
                    a.N >= 1 && a.residual == nullptr && a.act != Activation::kSilu && a.split_k_slices <= 1 &&
                    aligned16(a.input) && aligned16(a.weight) && aligned16(a.output);
  if (!fits) return cutlass::Status::kErrorNotSupported;
  Epilogue ep{a.output, a.bias, a.bias_scalar, a.scale, a.post_bias, a.act == Activation::kRelu ? 1 : 0,
              a.N * (a.H / kTileRows), a.H / kTileRows};
  return launch_halo<halo_conv_kernel<T>, T>(a.input, a.weight, a.N, a.H, ep.tiles, ep, stream, a.programmatic_launch);
}

}  // namespace sm90_halo

const KernelEntry kHaloKernels[] = {
    {"cutlass_ops_conv2d_fused_f16_sm90_halo3x3s1_w16c64k64_align8", 90, DType::kF16, 8, sm90_halo::kM, sm90_halo::kK, sm90_halo::kC,
     sm90_halo::kStages, &sm90_halo::run<cute::half_t>},
    {"cutlass_ops_conv2d_fused_bf16_sm90_halo3x3s1_w16c64k64_align8", 90, DType::kBF16, 8, sm90_halo::kM, sm90_halo::kK, sm90_halo::kC,
     sm90_halo::kStages, &sm90_halo::run<cute::bfloat16_t>},
};
const int kNumHaloKernels = 2;

}  // namespace conv2d_fused
}  // namespace cutlass_ops
