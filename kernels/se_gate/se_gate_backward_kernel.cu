#include "se_gate/se_gate_backward_kernel.h"

#include "common/half_chunk.cuh"
#include "common/programmatic_launch.cuh"

namespace cutlass_ops {
namespace se_gate {
namespace {

constexpr int kThreads = 512;  // as the forward: one CTA per image, many loads in flight
constexpr int kVec = 8;        // channels per 16-byte access
constexpr int kWarps = kThreads / 32;

// Shared memory, in floats: per-thread partial sums (16-byte vector stores), then per
// channel the squeeze, d_gate (later d_pre2), the gate and d_squeeze / HW, per hidden unit
// pre1 and d_pre1, and the two FixUp sums' per-warp partials.
struct BackwardSmem {
  int partial, squeeze, d_gate, gate, d_squeeze, pre1, d_pre1, sums, total;
  __host__ __device__ BackwardSmem(int C, int R) {
    partial = 0;
    squeeze = partial + kThreads * kVec;
    d_gate = squeeze + C;
    gate = d_gate + C;
    d_squeeze = gate + C;
    pre1 = d_squeeze + C;
    d_pre1 = pre1 + R;
    sums = d_pre1 + R;
    total = sums + 2 * kWarps;
  }
};

// The per-thread partials of 8 channels (thread t: channel group t % G, rows t / G) summed
// over the rows into dst[C], in a fixed order (deterministic).
__device__ void reduce_partials(float* partial, float const (&acc)[kVec], float* dst, int C, int G,
                                int rows_per_pass, float scale) {
  auto* mine = reinterpret_cast<float4*>(partial + threadIdx.x * kVec);
  mine[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
  mine[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
  __syncthreads();
  for (int c = threadIdx.x; c < C; c += kThreads) {
    float s = 0.f;
    for (int r = 0; r < rows_per_pass; ++r) s += partial[(r * G + c / kVec) * kVec + c % kVec];
    dst[c] = s * scale;
  }
  __syncthreads();  // partial is free again
}

__device__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

template <typename T>
__global__ void __launch_bounds__(kThreads, 2) se_gate_backward_kernel(SeGateBackwardArgs a) {
  wait_for_previous_grid();
  extern __shared__ float smem[];
  BackwardSmem const layout(a.C, a.R);
  float* partial = smem + layout.partial;
  float* squeeze = smem + layout.squeeze;
  float* d_gate = smem + layout.d_gate;  // then d_pre2
  float* gate = smem + layout.gate;
  float* d_squeeze = smem + layout.d_squeeze;
  float* pre1 = smem + layout.pre1;
  float* d_pre1 = smem + layout.d_pre1;
  float* warp_sums = smem + layout.sums;
  int const tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  int const n = blockIdx.x, C = a.C, R = a.R, HW = a.H * a.W;
  size_t const base = size_t(n) * HW * C;
  T const* grad_out = static_cast<T const*>(a.grad_out) + base;
  T const* h = static_cast<T const*>(a.h) + base;
  T const* out = static_cast<T const*>(a.out) + base;
  T* grad_y = static_cast<T*>(a.grad_y) + base;
  T* grad_h = static_cast<T*>(a.grad_h) + base;
  T const* grad_pooled =
      a.grad_pooled ? static_cast<T const*>(a.grad_pooled) + size_t(n) * a.P * a.Q * C : nullptr;
  // The value an inactive output holds: post_bias rounded as the forward rounded it.
  bool const has_post_bias = a.post_bias != nullptr;
  float const inactive = has_post_bias ? to_float(from_float<T>(*a.post_bias)) : 0.f;

  // Pass 1: g (with the pool's gradient), the mask, dy stored; per-channel sums of h and
  // dy*h, and the image's sums of g and dy.
  int const G = C / kVec;
  int const rows_per_pass = kThreads / G;  // >= 1: the op guarantees C <= 8 * kThreads
  int const group = tid % G, row0 = tid / G, c0 = group * kVec;
  float sum_h[kVec] = {}, sum_dyh[kVec] = {};
  float sum_g = 0.f, sum_dy = 0.f;
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
        sum_g += g[k];
        sum_dy += dy;
        float const hk = to_float(hv.v[k]);
        sum_h[k] += hk;
        sum_dyh[k] += dy * hk;
        gv.v[k] = from_float<T>(dy);
      }
      gv.store(grad_y + at);
    }
  }
  float const inv_hw = 1.f / HW;
  reduce_partials(partial, sum_h, squeeze, C, G, rows_per_pass, inv_hw);
  reduce_partials(partial, sum_dyh, d_gate, C, G, rows_per_pass, 1.f);
  sum_g = warp_sum(sum_g);
  sum_dy = warp_sum(sum_dy);
  if (lane == 0) {
    warp_sums[warp] = sum_g;
    warp_sums[kWarps + warp] = sum_dy;
  }

  // The gate, recomputed: pre1 = W1 squeeze + b1 (a warp per hidden unit, float4 loads of
  // the W1 row and a shuffle reduction), then pre2 and the sigmoid per channel.
  auto const* w1v = reinterpret_cast<float4 const*>(a.w1);  // 16-byte aligned (the op checks)
  int const C4 = C / 4;
  for (int r = warp; r < R; r += kWarps) {
    float dot = 0.f;
    for (int c4 = lane; c4 < C4; c4 += 32) {
      float4 const w = w1v[size_t(r) * C4 + c4];
      float4 const s = reinterpret_cast<float4 const*>(squeeze)[c4];
      dot += w.x * s.x + w.y * s.y + w.z * s.z + w.w * s.w;
    }
    dot = warp_sum(dot);
    if (lane == 0) pre1[r] = dot + a.b1[r];
  }
  __syncthreads();
  if (tid < 2) {  // the image's FixUp sums, in a fixed order
    float s = 0.f;
    for (int w = 0; w < kWarps; ++w) s += warp_sums[tid * kWarps + w];
    a.sums[2 * size_t(n) + tid] = s;
  }
  for (int c = tid; c < C; c += kThreads) {
    float pre2 = a.b2[c];
    float const* row = a.w2 + size_t(c) * R;
    for (int r = 0; r < R; ++r) pre2 += row[r] * fmaxf(pre1[r], 0.f);
    float const sig = 1.f / (1.f + __expf(-pre2));
    gate[c] = sig;
    float const dp2 = d_gate[c] * sig * (1.f - sig);
    d_gate[c] = dp2;
    a.d_pre2[size_t(n) * C + c] = dp2;
    a.squeeze[size_t(n) * C + c] = squeeze[c];
  }
  __syncthreads();

  // d_pre1 = (d_pre2 W2) * (pre1 > 0): a warp per hidden unit over the channels.
  for (int r = warp; r < R; r += kWarps) {
    float dot = 0.f;
    for (int c = lane; c < C; c += 32) dot += d_gate[c] * a.w2[size_t(c) * R + r];
    dot = warp_sum(dot);
    if (lane == 0) {
      float const hid = fmaxf(pre1[r], 0.f);
      float const dp1 = pre1[r] > 0.f ? dot : 0.f;
      d_pre1[r] = dp1;
      a.d_pre1[size_t(n) * R + r] = dp1;
      a.hidden[size_t(n) * R + r] = hid;
    }
  }
  __syncthreads();
  // d_squeeze = d_pre1 W1 (coalesced over the channels), already divided by H*W.
  for (int c = tid; c < C; c += kThreads) {
    float s = 0.f;
    for (int r = 0; r < R; ++r) s += d_pre1[r] * a.w1[size_t(r) * C + c];
    d_squeeze[c] = s * inv_hw;
  }
  __syncthreads();  // also: this CTA's grad_y stores are visible to all its threads

  // Pass 2: grad_h = dy * gate + d_squeeze / HW, dy read back (from L2: this CTA wrote it).
  for (int i = tid; i < HW * G; i += kThreads) {
    int const c = (i % G) * kVec;
    HalfChunk<T, kVec> dv;
    dv.load(grad_y + size_t(i) * kVec);
#pragma unroll
    for (int k = 0; k < kVec; ++k) dv.v[k] = from_float<T>(to_float(dv.v[k]) * gate[c + k] + d_squeeze[c + k]);
    dv.store(grad_h + size_t(i) * kVec);
  }
}

template <typename T>
cudaError_t launch_typed(SeGateBackwardArgs const& a, cudaStream_t stream) {
  size_t const smem = se_gate_backward_smem_bytes(a.C, a.R);
  if (smem > 48 * 1024) {
    cudaError_t err = cudaFuncSetAttribute(se_gate_backward_kernel<T>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (err != cudaSuccess) return err;
  }
  return launch_kernel<se_gate_backward_kernel<T>>(unsigned(a.N), kThreads, smem, stream,
                                                   a.programmatic_launch, a);
}

}  // namespace

size_t se_gate_backward_smem_bytes(int C, int R) { return sizeof(float) * BackwardSmem(C, R).total; }

cudaError_t launch_se_gate_backward(SeGateBackwardArgs const& a, cudaStream_t stream) {
  if (a.N == 0) return cudaSuccess;
  return a.dtype == DType::kF16 ? launch_typed<__half>(a, stream) : launch_typed<__nv_bfloat16>(a, stream);
}

}  // namespace se_gate
}  // namespace cutlass_ops
