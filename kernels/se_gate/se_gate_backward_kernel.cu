#include "se_gate/se_gate_backward_kernel.h"

#include "common/dynamic_smem.h"
#include "common/grid_size.h"
#include "common/grid_sum.cuh"
#include "common/half_chunk.cuh"
#include "common/programmatic_launch.cuh"

namespace cutlass_ops {
namespace se_gate {
namespace {

constexpr int kThreads = 256;
constexpr int kVec = 8;  // channels per 16-byte access
constexpr int kWarps = kThreads / 32;
constexpr int kMaxImagesPerCta = 8;

// ---- 1. per image: dy, its sums, the squeeze and d_gate ------------------------------------

// The per-thread partials of 8 channels (thread t: channel group t % G, rows t / G) summed
// over the rows into dst[C] (global memory), in a fixed order (deterministic).
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

// One CTA per image, streaming: 4 CTAs of 256 threads per SM keep the loads in flight and
// hold N=512 images in one wave on an H100 (64 registers, 16 bytes spilled; with 3 per SM, 80
// registers, block 0's pass took 36.8 instead of 28.6 us at N=512).
template <typename T>
__global__ void __launch_bounds__(kThreads, 4) se_gate_backward_reduce_kernel(SeGateBackwardArgs a) {
  wait_for_previous_grid();
  __shared__ float4 scratch4[kThreads * kVec / 4];
  float* scratch = reinterpret_cast<float*>(scratch4);
  int const C = a.C, HW = a.H * a.W, n = blockIdx.x;
  int const tid = threadIdx.x;
  size_t const base = size_t(n) * HW * C;
  // __restrict__: the next pixel's loads may move above this pixel's store.
  T const* __restrict__ grad_out = static_cast<T const*>(a.grad_out) + base;
  T const* __restrict__ h = static_cast<T const*>(a.h) + base;
  T const* __restrict__ out = static_cast<T const*>(a.out) + base;
  T* __restrict__ grad_y = static_cast<T*>(a.grad_y) + base;
  T const* __restrict__ grad_pooled = a.grad_pooled == nullptr ? nullptr
      : static_cast<T const*>(a.grad_pooled) + size_t(n) * a.P * a.Q * C;
  // The value an inactive output holds: post_bias rounded as the forward rounded it.
  bool const has_post_bias = a.post_bias != nullptr;
  float const inactive = has_post_bias ? to_float(from_float<T>(*a.post_bias)) : 0.f;
  float const h_bias = a.h_bias != nullptr ? *a.h_bias : 0.f;
  // The input kernel's finished-block count, zeroed here: that kernel runs after this one
  // has completed (each launch waits for its predecessor), and no memset is needed.
  if (n == 0 && tid == 0) *a.grad_h_counter = 0u;

  int const G = C / kVec;
  int const rows_per_pass = kThreads / G;  // >= 1: the op guarantees C <= 8 * kThreads
  int const row0 = tid / G, c0 = (tid % G) * kVec;
  float sum_h[kVec] = {}, sum_dyh[kVec] = {};
  float sums[2] = {0.f, 0.f};  // of the gradient before and after the ReLU mask
  if (row0 < rows_per_pass) {
    for (int p = row0; p < HW; p += rows_per_pass) {
      size_t const at = size_t(p) * C + c0;
      HalfChunk<T, kVec> gv, ov, hv;
      gv.load(grad_out + at);
      ov.load(out + at);
      hv.load(h + at);
      float g[kVec];
#pragma unroll
      for (int k = 0; k < kVec; ++k) g[k] = to_float(gv.v[k]);
      if (grad_pooled != nullptr) {
        // Pooled row q covers rows 2q-1 .. 2q+1, so row y is covered by q = y/2 and, for odd
        // y, (y+1)/2 when that exists; the same for columns.  The (at most) four windows
        // are loaded at once (a missing one re-reads the first with weight 0): loads in a
        // loop with data-dependent bounds were waited for one at a time.  Times 1/9, not
        // / 9 (ATen divides; the two differ by at most an ulp): with the IEEE division this
        // kernel took 284 us instead of 112 us on block 0's real gradients at N=2048 on an
        // H100 (ncu), though random inputs ran at full speed; the division's slow path, for
        // operands such as the zeros that masked gradients are full of, is the likely cause.
        int const y = p / a.W, x = p % a.W;
        int const q0 = y >> 1, r0 = x >> 1;
        bool const q1_ok = (y & 1) && q0 + 1 < a.P, r1_ok = (x & 1) && r0 + 1 < a.Q;
        int const q1 = q1_ok ? q0 + 1 : q0, r1 = r1_ok ? r0 + 1 : r0;
        HalfChunk<T, kVec> pv[4];
        pv[0].load(grad_pooled + (size_t(q0) * a.Q + r0) * C + c0);
        pv[1].load(grad_pooled + (size_t(q0) * a.Q + r1) * C + c0);
        pv[2].load(grad_pooled + (size_t(q1) * a.Q + r0) * C + c0);
        pv[3].load(grad_pooled + (size_t(q1) * a.Q + r1) * C + c0);
        float const weight[4] = {1.f, r1_ok ? 1.f : 0.f, q1_ok ? 1.f : 0.f, q1_ok && r1_ok ? 1.f : 0.f};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
#pragma unroll
          for (int k = 0; k < kVec; ++k) g[k] += weight[j] * to_float(pv[j].v[k]) * (1.0f / 9.0f);
        }
      }
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        float const o = to_float(ov.v[k]);
        bool const active = has_post_bias ? !(o == inactive) : o > 0.f;  // NaN counts as active
        float const dy = active ? g[k] : 0.f;
        float const hk = to_float(hv.v[k]) + h_bias;
        sums[0] += g[k];
        sums[1] += dy;
        sum_h[k] += hk;
        sum_dyh[k] += dy * hk;
        gv.v[k] = from_float<T>(dy);
      }
      gv.store(grad_y + at);
    }
  }
  reduce_partials(scratch, sum_h, a.squeeze + size_t(n) * C, C, G, rows_per_pass, 1.f / HW);
  reduce_partials(scratch, sum_dyh, a.d_gate + size_t(n) * C, C, G, rows_per_pass, 1.f);
  block_sum<kThreads>(sums);  // the image's FixUp sums, in a fixed order
  if (tid == 0) {
    a.sums[2 * size_t(n)] = sums[0];
    a.sums[2 * size_t(n) + 1] = sums[1];
  }
}

// ---- 2. the excite MLP's backward, kImages images per CTA -----------------------------------

// Shared memory, in floats: W2 (C, R) with rows padded to R + 1 (conflict-free both by row,
// thread per channel, and by column, lanes over the channels), then per image and channel
// the squeeze and d_gate (then d_pre2), per image and hidden unit pre1 and relu(pre1).
struct ExciteSmem {
  int w2, squeeze, d_gate, pre1, hidden, total;
  __host__ __device__ ExciteSmem(int C, int R, int images) {
    w2 = 0;
    squeeze = w2 + C * (R + 1);
    d_gate = squeeze + images * C;
    pre1 = d_gate + images * C;
    hidden = pre1 + images * R;
    total = hidden + images * R;
  }
};

// W2 (C, R) row-major into shared memory rows of pitch R + 1, with coalesced reads.  Float4
// loads when R % 4 == 0: thread t keeps one float4 column r4 of every (kThreads / R4)-th row,
// so no per-element division by R (at C=512, R=32 the scalar loop's index math was most of
// the kernel's instructions).
__device__ void stage_w2(float const* __restrict__ w2, float* w2s, int C, int R) {
  int const R4 = R / 4;
  if (R % 4 == 0 && R4 <= kThreads) {
    int const rows_per_pass = kThreads / R4, c0 = threadIdx.x / R4, r = 4 * (threadIdx.x % R4);
    if (c0 >= rows_per_pass) return;
    auto const* w2v = reinterpret_cast<float4 const*>(w2);  // 16-byte aligned (the op checks)
#pragma unroll 4
    for (int c = c0; c < C; c += rows_per_pass) {
      float4 const w = w2v[size_t(c) * R4 + r / 4];
      float* dst = w2s + c * (R + 1) + r;
      dst[0] = w.x;
      dst[1] = w.y;
      dst[2] = w.z;
      dst[3] = w.w;
    }
  } else {
#pragma unroll 8
    for (int i = threadIdx.x; i < C * R; i += kThreads) w2s[(i / R) * (R + 1) + i % R] = w2[i];
  }
}

template <int kImages>
__global__ void __launch_bounds__(kThreads) se_gate_backward_excite_kernel(SeGateBackwardArgs a) {
  wait_for_previous_grid();
  extern __shared__ float smem[];
  int const C = a.C, R = a.R;
  ExciteSmem const layout(C, R, kImages);
  float* w2s = smem + layout.w2;           // [C][R + 1]
  float* squeeze = smem + layout.squeeze;  // [images][C]
  float* d_gate = smem + layout.d_gate;    // [images][C], then d_pre2
  float* pre1 = smem + layout.pre1;        // [images][R]
  float* hidden = smem + layout.hidden;    // [images][R]
  int const tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  int const n0 = blockIdx.x * kImages;
  int const images = min(kImages, a.N - n0);  // the last CTA may have fewer
  float const* __restrict__ w1 = a.w1;
  float const* __restrict__ w2 = a.w2;
  stage_w2(w2, w2s, C, R);
  for (int i = tid; i < images * C; i += kThreads) {
    squeeze[i] = a.squeeze[size_t(n0) * C + i];
    d_gate[i] = a.d_gate[size_t(n0) * C + i];
  }
  __syncthreads();

  // pre1 = W1 squeeze + b1: a warp per hidden unit, float4 loads of the W1 row, a shuffle
  // reduction; each W1 element is loaded once for the CTA's images.
  auto const* __restrict__ w1v = reinterpret_cast<float4 const*>(w1);  // 16-byte aligned (the op checks)
  int const C4 = C / 4;
  for (int r = warp; r < R; r += kWarps) {
    float const bias = a.b1[r];
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
      float const d = warp_sum(dot[i]) + bias;
      if (lane == 0 && i < images) {
        pre1[i * R + r] = d;
        hidden[i * R + r] = d < 0.f ? 0.f : d;  // keeps NaN, like torch.relu (and the forward)
      }
    }
  }
  __syncthreads();

  // pre2 = W2 hidden + b2 per channel (a thread each), the gate, d_pre2 = d_gate * gate * (1 - gate).
  for (int c = tid; c < C; c += kThreads) {
    float const bias = a.b2[c];
    float dot[kImages];
#pragma unroll
    for (int i = 0; i < kImages; ++i) dot[i] = bias;
    for (int r = 0; r < R; ++r) {
      float const w = w2s[c * (R + 1) + r];
#pragma unroll
      for (int i = 0; i < kImages; ++i) dot[i] += w * hidden[i * R + r];
    }
#pragma unroll
    for (int i = 0; i < kImages; ++i) {
      if (i < images) {
        float const sig = 1.f / (1.f + __expf(-dot[i]));
        float const dp2 = d_gate[i * C + c] * sig * (1.f - sig);
        d_gate[i * C + c] = dp2;
        a.gate[size_t(n0 + i) * C + c] = sig;
        a.d_pre2[size_t(n0 + i) * C + c] = dp2;
      }
    }
  }
  __syncthreads();

  // d_pre1 = (d_pre2 W2) * (pre1 > 0): a warp per hidden unit, lanes over the channels.
  for (int r = warp; r < R; r += kWarps) {
    float dot[kImages] = {};
    for (int c = lane; c < C; c += 32) {
      float const w = w2s[c * (R + 1) + r];
#pragma unroll
      for (int i = 0; i < kImages; ++i) dot[i] += w * d_gate[i * C + c];
    }
#pragma unroll
    for (int i = 0; i < kImages; ++i) {
      float const d = warp_sum(dot[i]);
      if (lane == 0 && i < images) {
        float const dp1 = pre1[i * R + r] > 0.f ? d : 0.f;
        pre1[i * R + r] = dp1;  // pre1 is d_pre1 from here on
        a.d_pre1[size_t(n0 + i) * R + r] = dp1;
        a.hidden[size_t(n0 + i) * R + r] = hidden[i * R + r];
      }
    }
  }
  __syncthreads();
  float const* d_pre1 = pre1;

  // d_squeeze = d_pre1 W1 (coalesced over the channels), divided by H*W.
  float const inv_hw = 1.f / (a.H * a.W);
  for (int c = tid; c < C; c += kThreads) {
    float s[kImages] = {};
#pragma unroll 8
    for (int r = 0; r < R; ++r) {
      float const w = w1[size_t(r) * C + c];
#pragma unroll
      for (int i = 0; i < kImages; ++i) s[i] += d_pre1[i * R + r] * w;
    }
#pragma unroll
    for (int i = 0; i < kImages; ++i)
      if (i < images) a.d_squeeze[size_t(n0 + i) * C + c] = s[i] * inv_hw;
  }
}

// ---- 3. grad_h = dy * gate + d_squeeze / HW, streaming ---------------------------------------

template <typename T>
__global__ void __launch_bounds__(kThreads) se_gate_backward_input_kernel(SeGateBackwardArgs a) {
  wait_for_previous_grid();
  int const G = a.C / kVec;
  long long const per_image = (long long)a.H * a.W * G;
  long long const chunks = a.N * per_image;
  T const* __restrict__ grad_y = static_cast<T const*>(a.grad_y);
  T* __restrict__ grad_h = static_cast<T*>(a.grad_h);
  float sum[1] = {0.f};  // of grad_h before rounding: h_bias's gradient
  for (long long i = (long long)blockIdx.x * kThreads + threadIdx.x; i < chunks;
       i += (long long)gridDim.x * kThreads) {
    size_t const nc = size_t(i / per_image) * a.C + (i % G) * kVec;  // (image, channel) of the chunk
    float4 const* gate4 = reinterpret_cast<float4 const*>(a.gate + nc);
    float4 const* dsq4 = reinterpret_cast<float4 const*>(a.d_squeeze + nc);
    float4 const g0 = gate4[0], g1 = gate4[1], d0 = dsq4[0], d1 = dsq4[1];
    float const gate[kVec] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
    float const dsq[kVec] = {d0.x, d0.y, d0.z, d0.w, d1.x, d1.y, d1.z, d1.w};
    HalfChunk<T, kVec> dv;
    dv.load(grad_y + i * kVec);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      float const gh = to_float(dv.v[k]) * gate[k] + dsq[k];
      sum[0] += gh;
      dv.v[k] = from_float<T>(gh);
    }
    dv.store(grad_h + i * kVec);
  }
  grid_sum<kThreads>(sum, a.grad_h_partials, a.grad_h_counter, a.grad_h_sum);
}

template <int kImages>
cudaError_t launch_excite(SeGateBackwardArgs const& a, cudaStream_t stream) {
  size_t const smem = se_gate_backward_smem_bytes(a.C, a.R, kImages);
  if (cudaError_t err = allow_dynamic_smem(se_gate_backward_excite_kernel<kImages>, smem); err != cudaSuccess)
    return err;
  unsigned const grid = unsigned((a.N + kImages - 1) / kImages);
  return launch_kernel<se_gate_backward_excite_kernel<kImages>>(grid, kThreads, smem, stream,
                                                                a.programmatic_launch, a);
}

template <typename T>
cudaError_t launch_per_image(SeGateBackwardArgs const& a, int images_per_cta, cudaStream_t stream) {
  cudaError_t err = launch_kernel<se_gate_backward_reduce_kernel<T>>(unsigned(a.N), kThreads, 0, stream,
                                                                     a.programmatic_launch, a);
  if (err != cudaSuccess) return err;
  switch (images_per_cta) {
    case 1: return launch_excite<1>(a, stream);
    case 2: return launch_excite<2>(a, stream);
    case 4: return launch_excite<4>(a, stream);
    case 8: return launch_excite<8>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

// One row of the batch sums (a row per chunk of images, then summed over the chunks): W1 (r, c),
// W2 transposed (r, c) so that a thread per channel writes both coalesced, b1, b2 and the
// two scalars.  Encoded by the partial kernel and decoded by the final one, both through here.
struct ParamLayout {
  int C, R;
  __device__ int w1(int r, int c) const { return r * C + c; }
  __device__ int w2(int r, int c) const { return R * C + r * C + c; }
  __device__ int b1(int r) const { return 2 * R * C + r; }
  __device__ int b2(int c) const { return 2 * R * C + R + c; }
  __device__ int identity_bias() const { return 2 * R * C + R + C; }
  __device__ int post_bias() const { return identity_bias() + 1; }
};

// The gradient entry e of the layout belongs to.
__device__ inline void store_param_grad(SeParamGradArgs const& a, ParamLayout const& l, int e, float v) {
  int const rc = l.R * l.C;
  if (e < l.b1(0)) {  // W1 or W2: (r, c) at r*C + c of its block
    int const block = e < rc ? 0 : 1, r = (e - block * rc) / l.C, c = (e - block * rc) % l.C;
    if (block == 0) a.grad_w1[l.w1(r, c)] = v;  // grad_w1 is (R, C), as the layout
    else a.grad_w2[c * l.R + r] = v;           // grad_w2 is (C, R)
  } else if (e < l.b2(0)) {
    a.grad_b1[e - l.b1(0)] = v;
  } else if (e < l.identity_bias()) {
    a.grad_b2[e - l.b2(0)] = v;
  } else {
    *(e == l.identity_bias() ? a.grad_identity_bias : a.grad_post_bias) = v;
  }
}

// One thread per channel c of a chunk of images: the products with every hidden unit r in
// registers (32 at a time), the chunk's d_pre1 and hidden rows in shared memory, so each
// per-image vector is read once.  Writes the chunk's row of partials (ParamLayout).
constexpr int kRTile = 32;
constexpr int kLoads = 8;

__global__ void __launch_bounds__(kThreads) se_param_grads_partial_kernel(SeParamGradArgs a, int entries,
                                                                          int images_per_chunk) {
  extern __shared__ float smem[];  // [images_per_chunk][R] d_pre1, then the same for hidden
  int const C = a.C, R = a.R;
  int const n0 = blockIdx.y * images_per_chunk;
  int const count = min(a.N - n0, images_per_chunk);
  float* s_dpre1 = smem;
  float* s_hidden = smem + images_per_chunk * R;
  for (int i = threadIdx.x; i < count * R; i += kThreads) {
    s_dpre1[i] = a.d_pre1[(int64_t)n0 * R + i];
    s_hidden[i] = a.hidden[(int64_t)n0 * R + i];
  }
  __syncthreads();
  float* out = a.partials + (int64_t)blockIdx.y * entries;
  ParamLayout const layout{C, R};
  int const c = blockIdx.x * kThreads + threadIdx.x;
  if (c < C) {
    float b2 = 0.0f;
    for (int r0 = 0; r0 < R; r0 += kRTile) {
      float w1[kRTile], w2[kRTile];
#pragma unroll
      for (int k = 0; k < kRTile; ++k) w1[k] = w2[k] = 0.0f;
      // Images in groups of kLoads, their loads issued together: one thread's loads are a
      // dependent chain otherwise, and latency, not bandwidth, bounded the kernel.
      for (int nb = 0; nb < count; nb += kLoads) {
        float sq[kLoads], dp2[kLoads];
#pragma unroll
        for (int j = 0; j < kLoads; ++j) {
          bool const valid = nb + j < count;
          sq[j] = valid ? a.squeeze[(int64_t)(n0 + nb + j) * C + c] : 0.0f;
          dp2[j] = valid ? a.d_pre2[(int64_t)(n0 + nb + j) * C + c] : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < kLoads; ++j) {
          if (nb + j >= count) break;
          int const n = nb + j;
          if (r0 == 0) b2 += dp2[j];
#pragma unroll
          for (int k = 0; k < kRTile; ++k) {
            if (r0 + k < R) {
              w1[k] += s_dpre1[n * R + r0 + k] * sq[j];
              w2[k] += s_hidden[n * R + r0 + k] * dp2[j];
            }
          }
        }
      }
#pragma unroll
      for (int k = 0; k < kRTile; ++k) {
        if (r0 + k < R) {
          out[layout.w1(r0 + k, c)] = w1[k];
          out[layout.w2(r0 + k, c)] = w2[k];
        }
      }
    }
    out[layout.b2(c)] = b2;
  }
  if (blockIdx.x == 0) {  // b1 and the two scalars
    for (int r = threadIdx.x; r < R; r += kThreads) {
      float b1 = 0.0f;
      for (int n = 0; n < count; ++n) b1 += s_dpre1[n * R + r];
      out[layout.b1(r)] = b1;
    }
    if (threadIdx.x == 0) {
      float identity_bias = 0.0f, post_bias = 0.0f;
      for (int n = n0; n < n0 + count; ++n) {
        identity_bias += a.sums[2 * n + 1];
        post_bias += a.sums[2 * n];
      }
      out[layout.identity_bias()] = identity_bias;
      out[layout.post_bias()] = post_bias;
    }
  }
}

__global__ void __launch_bounds__(kThreads) se_param_grads_final_kernel(SeParamGradArgs a, int entries, int chunks) {
  int const e = blockIdx.x * kThreads + threadIdx.x;
  if (e >= entries) return;
  float acc = 0.0f;
  int k = 0;
  for (; k + kLoads <= chunks; k += kLoads) {  // loads issued together, added in a fixed order
    float v[kLoads];
#pragma unroll
    for (int j = 0; j < kLoads; ++j) v[j] = a.partials[(int64_t)(k + j) * entries + e];
#pragma unroll
    for (int j = 0; j < kLoads; ++j) acc += v[j];
  }
  for (; k < chunks; ++k) acc += a.partials[(int64_t)k * entries + e];
  store_param_grad(a, ParamLayout{a.C, a.R}, e, acc);
}

}  // namespace

int se_param_grad_entries(int C, int R) { return 2 * C * R + R + C + 2; }

int se_param_grad_chunks(int N, int C, int R) {
  // Chunks of 16 images, the partials (chunks x entries floats) kept under 8 MB and each
  // chunk's two (images x R) tiles under 32 KB of shared memory.  (On an H100, the whole
  // se_gate_backward with 16-image chunks ran within 7% of its best over 4-128 chunks, for
  // FusedResNet's four SE shapes at N = 512 and 2048.  2-8 images a chunk, which had given
  // every SM two CTAs, wrote so many partials that C=256 at N=512 took 52 us instead of 37.)
  int chunks = (N + 15) / 16;
  chunks = min(chunks, max(1, (2 << 20) / se_param_grad_entries(C, R)));
  int const max_images = max(1, (32 << 10) / int(2 * sizeof(float) * R));
  chunks = max(chunks, (N + max_images - 1) / max_images);
  return max(1, min(chunks, N));
}

cudaError_t launch_se_gate_param_grads(SeParamGradArgs const& a, int chunks, cudaStream_t stream) {
  int const entries = se_param_grad_entries(a.C, a.R);
  int const images_per_chunk = (a.N + chunks - 1) / chunks;
  size_t const smem = 2 * sizeof(float) * images_per_chunk * a.R;
  se_param_grads_partial_kernel<<<dim3((a.C + kThreads - 1) / kThreads, chunks), kThreads, smem, stream>>>(
      a, entries, images_per_chunk);
  se_param_grads_final_kernel<<<(entries + kThreads - 1) / kThreads, kThreads, 0, stream>>>(a, entries, chunks);
  return cudaGetLastError();
}

int se_gate_backward_input_blocks(int N, int H, int W, int C, int num_sms) {
  long long const chunks = (long long)N * H * W * (C / kVec);
  long long const blocks = (chunks + kThreads - 1) / kThreads;
  // Grid-stride beyond 8 CTAs per SM (full occupancy): more blocks only lengthen the tail,
  // where the last block adds every block's partial sum.
  return clamp_grid(blocks, 8LL * num_sms);
}

size_t se_gate_backward_smem_bytes(int C, int R, int images_per_cta) {
  return sizeof(float) * ExciteSmem(C, R, images_per_cta).total;
}

bool se_gate_backward_supported(int C, int R, size_t max_smem_bytes) {
  return C % kVec == 0 && C <= kVec * kThreads && R >= 1 && se_gate_backward_smem_bytes(C, R, 1) <= max_smem_bytes;
}

int se_gate_backward_images_per_cta(int N, int C, int R, int num_sms, size_t max_smem_bytes) {
  // Each excite CTA reads W1 twice and stages W2: group as many images as still leave a CTA
  // for every SM (and fit in shared memory).
  int images = 1;
  while (images < kMaxImagesPerCta && N / (2 * images) >= num_sms &&
         se_gate_backward_smem_bytes(C, R, 2 * images) <= max_smem_bytes) {
    images *= 2;
  }
  return images;
}

cudaError_t launch_se_gate_backward_per_image(SeGateBackwardArgs const& a, int images_per_cta,
                                              cudaStream_t stream) {
  if (a.N == 0) return cudaSuccess;
  return a.dtype == DType::kF16 ? launch_per_image<__half>(a, images_per_cta, stream)
                                : launch_per_image<__nv_bfloat16>(a, images_per_cta, stream);
}

cudaError_t launch_se_gate_backward_input(SeGateBackwardArgs const& a, int num_sms, cudaStream_t stream) {
  if (a.N == 0) return cudaSuccess;
  unsigned const grid = unsigned(se_gate_backward_input_blocks(a.N, a.H, a.W, a.C, num_sms));
  return a.dtype == DType::kF16
      ? launch_kernel<se_gate_backward_input_kernel<__half>>(grid, kThreads, 0, stream, a.programmatic_launch, a)
      : launch_kernel<se_gate_backward_input_kernel<__nv_bfloat16>>(grid, kThreads, 0, stream,
                                                                    a.programmatic_launch, a);
}

}  // namespace se_gate
}  // namespace cutlass_ops
