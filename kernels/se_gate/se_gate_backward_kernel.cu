#include "se_gate/se_gate_backward_kernel.h"

#include "common/half_chunk.cuh"
#include "common/programmatic_launch.cuh"

namespace cutlass_ops {
namespace se_gate {
namespace {

constexpr int kThreads = 256;
constexpr int kVec = 8;  // channels per 16-byte access
constexpr int kWarps = kThreads / 32;
constexpr int kMaxImagesPerCta = 8;
constexpr int kMaxHidden = 32;  // R must divide 32: the excite loops reduce over R lanes
constexpr int kLoads = 8;       // W2 loads in flight per thread in the excite loops

// Shared memory, in floats: a scratch area (per-thread partial sums of 8 channels, later
// the per-warp partials of d_pre1), then per image and channel the squeeze, d_gate (later
// d_pre2), the gate and d_squeeze / HW, per image and hidden unit pre1 and d_pre1, and per
// image the two FixUp sums' per-warp partials.
struct BackwardSmem {
  int scratch, squeeze, d_gate, gate, d_squeeze, pre1, d_pre1, sums, total;
  __host__ __device__ BackwardSmem(int C, int R, int images) {
    scratch = 0;  // kThreads * kVec >= kWarps * kMaxImagesPerCta * kMaxHidden
    squeeze = scratch + kThreads * kVec;
    d_gate = squeeze + images * C;
    gate = d_gate + images * C;
    d_squeeze = gate + images * C;
    pre1 = d_squeeze + images * C;
    d_pre1 = pre1 + images * R;
    sums = d_pre1 + images * R;
    total = sums + images * 2 * kWarps;
  }
};
static_assert(kThreads * kVec >= kWarps * kMaxImagesPerCta * kMaxHidden, "scratch holds d_pre1's partials");

__device__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// The per-thread partials of 8 channels (thread t: channel group t % G, rows t / G) summed
// over the rows into dst[C], in a fixed order (deterministic).
__device__ void reduce_partials(float* scratch, float const (&acc)[kVec], float* dst, int C, int G,
                                int rows_per_pass, float scale) {
  auto* mine = reinterpret_cast<float4*>(scratch + threadIdx.x * kVec);
  mine[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
  mine[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
  __syncthreads();
  for (int c = threadIdx.x; c < C; c += kThreads) {
    float s = 0.f;
    for (int r = 0; r < rows_per_pass; ++r) s += scratch[(r * G + c / kVec) * kVec + c % kVec];
    dst[c] = s * scale;
  }
  __syncthreads();  // scratch is free again
}

// One CTA per kImages consecutive images (more than one for small images: the excite
// weights are then read once per group).
template <typename T, int kImages>
__global__ void __launch_bounds__(kThreads, 2) se_gate_backward_kernel(SeGateBackwardArgs a) {
  wait_for_previous_grid();
  extern __shared__ float smem[];
  int const C = a.C, R = a.R, HW = a.H * a.W;
  BackwardSmem const layout(C, R, kImages);
  float* scratch = smem + layout.scratch;
  float* squeeze = smem + layout.squeeze;      // [images][C]
  float* d_gate = smem + layout.d_gate;        // [images][C], then d_pre2
  float* gate = smem + layout.gate;            // [images][C]
  float* d_squeeze = smem + layout.d_squeeze;  // [images][C], divided by HW
  float* pre1 = smem + layout.pre1;            // [images][R]
  float* d_pre1 = smem + layout.d_pre1;        // [images][R]
  float* warp_sums = smem + layout.sums;       // [images][2][kWarps]
  int const tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  int const n0 = blockIdx.x * kImages;
  int const images = min(kImages, a.N - n0);  // the last CTA may have fewer
  size_t const base = size_t(n0) * HW * C;
  // __restrict__: the loads of the next pixel may move above this pixel's store.
  T const* __restrict__ grad_out = static_cast<T const*>(a.grad_out) + base;
  T const* __restrict__ h = static_cast<T const*>(a.h) + base;
  T const* __restrict__ out = static_cast<T const*>(a.out) + base;
  T* __restrict__ grad_y = static_cast<T*>(a.grad_y) + base;
  T* __restrict__ grad_h = static_cast<T*>(a.grad_h) + base;
  float const* __restrict__ w1 = a.w1;
  float const* __restrict__ w2 = a.w2;
  // The value an inactive output holds: post_bias rounded as the forward rounded it.
  bool const has_post_bias = a.post_bias != nullptr;
  float const inactive = has_post_bias ? to_float(from_float<T>(*a.post_bias)) : 0.f;

  // Pass 1, per image: g (with the pool's gradient), the mask, dy stored; per-channel sums
  // of h and dy*h, and the image's sums of g and dy.
  int const G = C / kVec;
  int const rows_per_pass = kThreads / G;  // >= 1: the op guarantees C <= 8 * kThreads
  int const group = tid % G, row0 = tid / G, c0 = group * kVec;
  float const inv_hw = 1.f / HW;
  for (int img = 0; img < images; ++img) {
    size_t const image = size_t(img) * HW * C;
    T const* __restrict__ grad_pooled = a.grad_pooled == nullptr ? nullptr
        : static_cast<T const*>(a.grad_pooled) + size_t(n0 + img) * a.P * a.Q * C;
    float sum_h[kVec] = {}, sum_dyh[kVec] = {};
    float sum_g = 0.f, sum_dy = 0.f;
    if (row0 < rows_per_pass) {
#pragma unroll 2
      for (int p = row0; p < HW; p += rows_per_pass) {
        size_t const at = image + size_t(p) * C + c0;
        HalfChunk<T, kVec> gv, ov, hv;
        gv.load(grad_out + at);
        ov.load(out + at);
        hv.load(h + at);
        float g[kVec];
#pragma unroll
        for (int k = 0; k < kVec; ++k) g[k] = to_float(gv.v[k]);
        if (grad_pooled != nullptr) {
          // Pooled row q covers rows 2q-1 .. 2q+1: row y is covered by q = y/2 .. (y+1)/2.
          int const y = p / a.W, x = p % a.W;
          int const q_end = min((y + 1) >> 1, a.P - 1), r_end = min((x + 1) >> 1, a.Q - 1);
          for (int q = y >> 1; q <= q_end; ++q) {
            for (int r = x >> 1; r <= r_end; ++r) {
              HalfChunk<T, kVec> pv;
              pv.load(grad_pooled + (size_t(q) * a.Q + r) * C + c0);
#pragma unroll
              for (int k = 0; k < kVec; ++k) g[k] += to_float(pv.v[k]) / 9.0f;  // as ATen: each term / 9
            }
          }
        }
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          float const o = to_float(ov.v[k]);
          bool const active = has_post_bias ? !(o == inactive) : o > 0.f;  // NaN counts as active
          float const dy = active ? g[k] : 0.f;
          float const hk = to_float(hv.v[k]);
          sum_g += g[k];
          sum_dy += dy;
          sum_h[k] += hk;
          sum_dyh[k] += dy * hk;
          gv.v[k] = from_float<T>(dy);
        }
        gv.store(grad_y + at);
      }
    }
    reduce_partials(scratch, sum_h, squeeze + img * C, C, G, rows_per_pass, inv_hw);
    reduce_partials(scratch, sum_dyh, d_gate + img * C, C, G, rows_per_pass, 1.f);
    sum_g = warp_sum(sum_g);
    sum_dy = warp_sum(sum_dy);
    if (lane == 0) {
      warp_sums[(2 * img) * kWarps + warp] = sum_g;
      warp_sums[(2 * img + 1) * kWarps + warp] = sum_dy;
    }
  }

  // The gate, recomputed.  pre1 = W1 squeeze + b1: a warp per hidden unit, float4 loads of
  // the W1 row, a shuffle reduction; each W1 element is loaded once for the CTA's images.
  auto const* __restrict__ w1v = reinterpret_cast<float4 const*>(w1);  // 16-byte aligned (the op checks)
  int const C4 = C / 4;
  for (int r = warp; r < R; r += kWarps) {
    float dot[kImages] = {};
#pragma unroll 4
    for (int c4 = lane; c4 < C4; c4 += 32) {
      float4 const w = w1v[size_t(r) * C4 + c4];
#pragma unroll
      for (int i = 0; i < kImages; ++i) {
        if (i < images) {
          float4 const s = reinterpret_cast<float4 const*>(squeeze + i * C)[c4];
          dot[i] += w.x * s.x + w.y * s.y + w.z * s.z + w.w * s.w;
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kImages; ++i) {
      float const d = warp_sum(dot[i]);
      if (lane == 0 && i < images) pre1[i * R + r] = d + a.b1[r];
    }
  }
  __syncthreads();
  if (tid < 2 * images) {  // the images' FixUp sums, in a fixed order
    float s = 0.f;
    for (int w = 0; w < kWarps; ++w) s += warp_sums[tid * kWarps + w];
    a.sums[2 * size_t(n0) + tid] = s;
  }

  // pre2 = W2 hidden + b2, the sigmoid and d_pre2 = d_gate * gate * (1 - gate).  W2 (C, R)
  // is read flat and coalesced, kLoads loads in flight per thread: R consecutive lanes hold
  // one channel's row (R divides 32), reduced by shuffles.  Same trip count in every warp.
  int const CR = C * R;
  int const r_mine = tid % R;  // kThreads is a multiple of R: each thread keeps one r
  for (int i0 = 0; i0 < CR; i0 += kLoads * kThreads) {
    float w[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      int const i = i0 + u * kThreads + tid;
      w[u] = i < CR ? w2[i] : 0.f;
    }
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      int const i = i0 + u * kThreads + tid, c = i / R;
#pragma unroll
      for (int img = 0; img < kImages; ++img) {
        float v = img < images ? w[u] * fmaxf(pre1[img * R + r_mine], 0.f) : 0.f;
        for (int off = R / 2; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (r_mine == 0 && i < CR && img < images) {
          float const sig = 1.f / (1.f + __expf(-(v + a.b2[c])));
          gate[img * C + c] = sig;
          float const dp2 = d_gate[img * C + c] * sig * (1.f - sig);
          d_gate[img * C + c] = dp2;
          a.d_pre2[size_t(n0 + img) * C + c] = dp2;
          a.squeeze[size_t(n0 + img) * C + c] = squeeze[img * C + c];
        }
      }
    }
  }
  __syncthreads();

  // d_pre1 = (d_pre2 W2) * (pre1 > 0): the same flat walk over W2, each thread summing its r;
  // then over the lanes of a warp with the same r (shuffles), then over the warps.
  float acc[kImages] = {};
  for (int i0 = 0; i0 < CR; i0 += kLoads * kThreads) {
    float w[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      int const i = i0 + u * kThreads + tid;
      w[u] = i < CR ? w2[i] : 0.f;
    }
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      int const c = min((i0 + u * kThreads + tid) / R, C - 1);  // w[u] is 0 past the end
#pragma unroll
      for (int img = 0; img < kImages; ++img)
        if (img < images) acc[img] += w[u] * d_gate[img * C + c];
    }
  }
#pragma unroll
  for (int img = 0; img < kImages; ++img) {
    float v = acc[img];
    for (int off = 16; off >= R; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
    if (lane < R) scratch[(warp * kImages + img) * R + lane] = v;
  }
  __syncthreads();
  for (int t = tid; t < images * R; t += kThreads) {
    int const img = t / R, r = t % R;
    float s = 0.f;
    for (int w = 0; w < kWarps; ++w) s += scratch[(w * kImages + img) * R + r];
    float const p1 = pre1[img * R + r];
    float const dp1 = p1 > 0.f ? s : 0.f;
    d_pre1[img * R + r] = dp1;
    a.d_pre1[size_t(n0 + img) * R + r] = dp1;
    a.hidden[size_t(n0 + img) * R + r] = fmaxf(p1, 0.f);
  }
  __syncthreads();
  // d_squeeze = d_pre1 W1 (coalesced over the channels), divided by H*W.
  for (int c = tid; c < C; c += kThreads) {
    float s[kImages] = {};
#pragma unroll 8
    for (int r = 0; r < R; ++r) {
      float const w = w1[size_t(r) * C + c];
#pragma unroll
      for (int img = 0; img < kImages; ++img)
        if (img < images) s[img] += d_pre1[img * R + r] * w;
    }
#pragma unroll
    for (int img = 0; img < kImages; ++img)
      if (img < images) d_squeeze[img * C + c] = s[img] * inv_hw;
  }
  __syncthreads();  // also: this CTA's grad_y stores are visible to all its threads

  // Pass 2: grad_h = dy * gate + d_squeeze / HW, dy read back (from L2: this CTA wrote it).
  int const chunks_per_image = HW * G;
#pragma unroll 2
  for (int i = tid; i < images * chunks_per_image; i += kThreads) {
    int const img = i / chunks_per_image, c = (i % G) * kVec;
    float const* gi = gate + img * C + c;
    float const* di = d_squeeze + img * C + c;
    HalfChunk<T, kVec> dv;
    dv.load(grad_y + size_t(i) * kVec);
#pragma unroll
    for (int k = 0; k < kVec; ++k) dv.v[k] = from_float<T>(to_float(dv.v[k]) * gi[k] + di[k]);
    dv.store(grad_h + size_t(i) * kVec);
  }
}

template <typename T, int kImages>
cudaError_t launch_typed(SeGateBackwardArgs const& a, cudaStream_t stream) {
  size_t const smem = se_gate_backward_smem_bytes(a.C, a.R, kImages);
  if (smem > 48 * 1024) {
    cudaError_t err = cudaFuncSetAttribute(se_gate_backward_kernel<T, kImages>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (err != cudaSuccess) return err;
  }
  unsigned const grid = unsigned((a.N + kImages - 1) / kImages);
  return launch_kernel<se_gate_backward_kernel<T, kImages>>(grid, kThreads, smem, stream,
                                                            a.programmatic_launch, a);
}

template <int kImages>
cudaError_t launch_images(SeGateBackwardArgs const& a, cudaStream_t stream) {
  return a.dtype == DType::kF16 ? launch_typed<__half, kImages>(a, stream)
                                : launch_typed<__nv_bfloat16, kImages>(a, stream);
}

}  // namespace

size_t se_gate_backward_smem_bytes(int C, int R, int images_per_cta) {
  return sizeof(float) * BackwardSmem(C, R, images_per_cta).total;
}

bool se_gate_backward_supported(int C, int R) {
  return C % kVec == 0 && C <= kVec * kThreads && R >= 1 && R <= kMaxHidden && kMaxHidden % R == 0;
}

int se_gate_backward_images_per_cta(int N, int H, int W, int C, int R, int num_sms, size_t max_smem_bytes) {
  // Group images while the excite weights a CTA reads (three walks over W1 or W2: 12 C R
  // bytes) outweigh the image data it moves (about seven 16-bit passes: 14 H W C bytes per
  // image), and the CTAs still fill every SM twice.
  long long const weight_bytes = 12LL * C * R, image_bytes = 14LL * H * W * C;
  int images = 1;
  while (images < kMaxImagesPerCta && weight_bytes > images * image_bytes && N / (2 * images) >= 2 * num_sms &&
         se_gate_backward_smem_bytes(C, R, 2 * images) <= max_smem_bytes) {
    images *= 2;
  }
  return images;
}

cudaError_t launch_se_gate_backward(SeGateBackwardArgs const& a, int images_per_cta, cudaStream_t stream) {
  if (a.N == 0) return cudaSuccess;
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
