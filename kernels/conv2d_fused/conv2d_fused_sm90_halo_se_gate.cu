// conv2d_fused_se_gate on sm_90a: the halo conv (conv2d_fused_sm90_halo.cuh) with se_gate as its
// epilogue, for FusedResNet block 0's conv2 (3x3 / stride 1 / pad 1, C = K = 64, 16 x 16 maps).
//
//   h   = scale * conv(x, w) + h_bias                 (float32; rounded to T once, in shared memory)
//   g   = sigmoid(W2 relu(W1 mean_hw(h) + b1) + b2)   (the mean over the float32 h)
//   out = relu(h * g + identity + identity_bias) + post_bias
//   pooled = avg_pool2d(out, 3, 2, 1, count_include_pad)   (optional: the next block's downsample input)
//
// As conv2d_fused + se_gate, h goes to HBM and comes back (twice) and se_gate is a kernel of its
// own; here a consumer warp group owns whole images.  The top tile's h waits in the group's 16 KB
// buffer (in T, as the two kernels round it) while the bottom tile's MMAs run; the bottom tile's
// stays in the accumulators.  The squeeze is a sum over a thread's values of both tiles and a
// shuffle over the four lanes that share a channel, the excite runs in the group, and the gate,
// residual and pooling go through the buffer a tile at a time.  The two consumer groups take
// every other image of the CTA: one group's epilogue runs under the other's MMAs.  HBM traffic
// per image: the input (through TMA, with its halo), the identity, the output and the pooled map;
// h never leaves the SM.
//
// A first version gave a CTA's image k the tiles 2k and 2k + 1, so both groups used every stage
// and group 1 waited on a stage's phase 1 before group 0's phase 0 had landed (a parity wait does
// not tell them apart): on an H100 it faulted or was wrong whenever a CTA took two images, and
// was right with one consumer group doing every image.  Hence the tile order in produce().
#include "conv2d_fused/conv2d_fused_sm90_halo.h"

#include "conv2d_fused/conv2d_fused_sm90_halo.cuh"

namespace cutlass_ops {
namespace conv2d_fused {
namespace sm90_halo {

constexpr int kImageRows = 2 * kTileRows;  // the maps this kernel takes: 16 x 16
constexpr int kImagePixels = kImageRows * kW;
constexpr int kPooledW = kW / 2;           // AvgPool2d(3, 2, 1) of 16 columns: 8

// 16 bytes of T as 8 floats, and back.
template <typename T>
__device__ __forceinline__ void unpack8(uint4 const& u, float (&v)[8]) {
  T const* e = reinterpret_cast<T const*>(&u);
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = float(e[i]);
}
template <typename T>
__device__ __forceinline__ uint4 pack8(float const (&v)[8]) {
  uint4 u;
  T* e = reinterpret_cast<T*>(&u);
#pragma unroll
  for (int i = 0; i < 8; ++i) e[i] = T(v[i]);
  return u;
}

template <typename T>
__global__ void __launch_bounds__(kThreads, 1)
    halo_se_gate_kernel(__grid_constant__ CUtensorMap const tmap_x, __grid_constant__ CUtensorMap const tmap_w,
                        HaloSeGateArgs const ep) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ char smem_raw[];
  Smem<T>& s = smem_of<T>(smem_raw);
  int const wg = threadIdx.x / 128;
  int const local_images = (ep.N - int(blockIdx.x) + int(gridDim.x) - 1) / int(gridDim.x);
  init_barriers(s);
  wait_for_previous_grid();  // before the first read of the inputs or write of the outputs

  // The CTA's k-th image (blockIdx.x + k * gridDim.x) goes to consumer group k % 2, as its tiles
  // 2k - k % 2 (top) and 2k - k % 2 + 2 (bottom): each group's tiles of one parity (produce), so
  // the tile order is group 0's top, group 1's top, group 0's bottom, group 1's bottom, ...
  if (wg == 0) {  // the producer
    if (threadIdx.x == 0)
      produce(s, tmap_x, tmap_w, 4 * ((local_images + 1) / 2), [&](int j) {
        int const k = 2 * (j / 4) + j % 2;
        return make_int2(k < local_images ? int(blockIdx.x) + k * int(gridDim.x) : -1, ((j / 2) % 2) * kTileRows);
      });
    return;
  }

  int const consumer = wg - 1, ct = threadIdx.x - 128 * wg, warp = ct / 32, lane = ct % 32;
  using TiledMma = decltype(make_tiled_mma(typename Mma<T>::Atom{}));
  TiledMma mma;
  auto thr = mma.get_thread_slice(ct);
  Tensor acc = partition_fragment_C(mma, Shape<Int<kK>, Int<kM>>{});

  int const ch0 = acc_channel0(ct), px0 = acc_pixel0(ct);
  float const scale = ep.scale ? *ep.scale : 1.f;
  float const h_bias = ep.h_bias ? *ep.h_bias : 0.f;
  float const idn_bias = ep.identity_bias ? *ep.identity_bias : 0.f;
  float const post = ep.post_bias ? *ep.post_bias : 0.f;
  T* out_buf = s.out[consumer];
  float* gates = s.se[consumer];        // [kK]: the channel sums, then the gates
  float* hidden = s.se[consumer] + kK;  // [R]
  auto group_sync = [&] { cutlass::arch::NamedBarrier::sync(128, 1 + consumer); };
  // h = scale * acc + h_bias in place, this thread's two channels summed into sum.
  auto to_h = [&](float (&sum)[2]) {
#pragma unroll
    for (int i = 0; i < size(acc); ++i) {
      acc(i) = fmaf(scale, acc(i), h_bias);
      sum[(i / 2) % 2] += acc(i);
    }
  };
  // acc (h) into the group's buffer in T, pixel-major (the accumulator layout: acc_channel0).
  auto to_buffer = [&] {
#pragma unroll
    for (int v1 = 0; v1 < 2; ++v1)
#pragma unroll
      for (int v0 = 0; v0 < 2; ++v0) {
        T* dst = out_buf + out_index(px0 + v0, ch0 + 8 * v1);
#pragma unroll
        for (int v2 = 0; v2 < kM / 8; ++v2) dst[8 * v2 * kK] = T(acc(v0 + 2 * v1 + 4 * v2));
      }
  };

  FullBarrier::wait(&s.filter_full, 0);
  for (int k = consumer; k < local_images; k += 2) {
    int const n = int(blockIdx.x) + k * int(gridDim.x);
    // The top tile's h goes to the buffer (rounded to T, as conv2d_fused + se_gate round it);
    // the bottom tile's stays in the accumulators until the gate is known.  The squeeze sums
    // both in float32 before any rounding.
    float sum[2] = {0.f, 0.f};
    int const top = 2 * k - consumer;  // this image's tiles: top, top + 2 (produce's order above)
    clear(acc);
    mma_tile(s, thr, acc, top);
    to_h(sum);
    group_sync();  // the previous image's readers of the buffer and of the gates are done
    to_buffer();
    clear(acc);
    mma_tile(s, thr, acc, top + 2);
    to_h(sum);

    // Squeeze: over the four lanes of the quad that holds this thread's two channels.
#pragma unroll
    for (int v1 = 0; v1 < 2; ++v1) {
      sum[v1] += __shfl_xor_sync(0xffffffffu, sum[v1], 1);
      sum[v1] += __shfl_xor_sync(0xffffffffu, sum[v1], 2);
    }
    if (ct % 4 == 0) {
      gates[ch0] = sum[0];
      gates[ch0 + 8] = sum[1];
    }
    group_sync();
    // Excite: hidden unit r by warp r % 4 (a dot over the 64 sums, two a lane), ReLU.
    for (int r = warp; r < ep.R; r += 4) {
      float d = ep.w1[r * kK + lane] * gates[lane] + ep.w1[r * kK + lane + 32] * gates[lane + 32];
#pragma unroll
      for (int off = 16; off > 0; off /= 2) d += __shfl_xor_sync(0xffffffffu, d, off);
      if (lane == 0) {
        float const pre = d * (1.f / kImagePixels) + ep.b1[r];
        hidden[r] = pre < 0.f ? 0.f : pre;  // keeps NaN, like torch.relu
      }
    }
    group_sync();  // hidden is complete; every read of the sums is done
    if (ct % 4 == 0) {  // the gates of this thread's two channels, over their sums
#pragma unroll
      for (int v1 = 0; v1 < 2; ++v1) {
        int const ch = ch0 + 8 * v1;
        float dot = 0.f;
        for (int r = 0; r < ep.R; ++r) dot += ep.w2[ch * ep.R + r] * hidden[r];
        gates[ch] = 1.f / (1.f + __expf(-(dot + ep.b2[ch])));
      }
    }

    // Gate, residual, ReLU and the pooling, a tile at a time through the group's buffer.
    // carry: for the bottom tile's first pooled row, row 7's three-column sums (threads 0-63:
    // pooled column ct / 8, channel chunk ct % 8), taken from the top tile's output.
    float carry[8];
    size_t const image_px = size_t(n) * kImagePixels;
#pragma unroll  // half a constant below
    for (int half = 0; half < 2; ++half) {
      size_t const tile_px = image_px + half * kM;
      // The identity's chunks first: their loads are in flight during what follows.
      uint4 idn[8];
      uint4 const* idn_src = reinterpret_cast<uint4 const*>(static_cast<T const*>(ep.identity) + tile_px * kK);
#pragma unroll
      for (int i = 0; i < 8; ++i) idn[i] = idn_src[ct + 128 * i];
      if (half == 1) {
        group_sync();  // the top tile's readers of the buffer are done
        to_buffer();
      }
      group_sync();  // the buffer (and, for the top tile, the gates) written
      uint4* out = reinterpret_cast<uint4*>(static_cast<T*>(ep.output) + tile_px * kK);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        int const chunk = ct + 128 * i, px = chunk / (kK / 8), c = chunk % (kK / 8);
        uint4* buf = reinterpret_cast<uint4*>(out_buf + out_chunk(px, c));
        float hv[8], x[8], o[8];
        unpack8<T>(*buf, hv);
        unpack8<T>(idn[i], x);
        float4 const g0 = reinterpret_cast<float4 const*>(gates + 8 * c)[0];
        float4 const g1 = reinterpret_cast<float4 const*>(gates + 8 * c)[1];
        float const g[8] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          float const v = hv[e] * g[e] + x[e] + idn_bias;
          o[e] = (v < 0.f ? 0.f : v) + post;  // keeps NaN, like torch.relu
        }
        uint4 const packed = pack8<T>(o);
        out[chunk] = packed;
        if (ep.pooled != nullptr) *buf = packed;  // pooled from the rounded output, as se_gate does
      }
      if (ep.pooled == nullptr) continue;
      group_sync();
      // AvgPool2d(3, 2, 1, count_include_pad): this tile's 4 pooled rows x 8 columns x 8 chunks,
      // two items a thread; buffer row -1 is the padding (top) or the carry (bottom).
#pragma unroll
      for (int it = 0; it < 2; ++it) {
        int const item = ct + 128 * it, p = item / 64, q = (item / 8) % 8, c = item % 8;
        float a[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) a[e] = (half == 1 && p == 0) ? carry[e] : 0.f;
        for (int r = max(2 * p - 1, 0); r <= 2 * p + 1; ++r)
          for (int col = max(2 * q - 1, 0); col <= min(2 * q + 1, kW - 1); ++col) {
            float v[8];
            unpack8<T>(*reinterpret_cast<uint4 const*>(out_buf + out_chunk(r * kW + col, c)), v);
#pragma unroll
            for (int e = 0; e < 8; ++e) a[e] += v[e];
          }
#pragma unroll
        for (int e = 0; e < 8; ++e) a[e] *= 1.f / 9.f;
        size_t const pooled_px = (size_t(n) * kPooledW + half * 4 + p) * kPooledW + q;
        reinterpret_cast<uint4*>(static_cast<T*>(ep.pooled) + pooled_px * kK)[c] = pack8<T>(a);
      }
      if (half == 0 && ct < 64) {
        int const q = ct / 8, c = ct % 8;
#pragma unroll
        for (int e = 0; e < 8; ++e) carry[e] = 0.f;
        for (int col = max(2 * q - 1, 0); col <= min(2 * q + 1, kW - 1); ++col) {
          float v[8];
          unpack8<T>(*reinterpret_cast<uint4 const*>(out_buf + out_chunk((kTileRows - 1) * kW + col, c)), v);
#pragma unroll
          for (int e = 0; e < 8; ++e) carry[e] += v[e];
        }
      }
    }
  }
#endif
}

cutlass::Status run_se_gate(HaloSeGateArgs const& a, cudaStream_t stream) {
  if (!halo_se_gate_fits(a)) return cutlass::Status::kErrorNotSupported;
  return a.dtype == DType::kF16
             ? launch_halo<halo_se_gate_kernel<half_t>, half_t>(a.input, a.weight, a.N, kImageRows, a.N, a, stream,
                                                                a.programmatic_launch)
             : launch_halo<halo_se_gate_kernel<bfloat16_t>, bfloat16_t>(a.input, a.weight, a.N, kImageRows, a.N, a,
                                                                        stream, a.programmatic_launch);
}

}  // namespace sm90_halo
}  // namespace conv2d_fused
}  // namespace cutlass_ops
